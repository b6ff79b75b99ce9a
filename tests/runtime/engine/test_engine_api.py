"""The engine's bookkeeping API: errors, blocks, pinning, prefix reuse, chunking."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import torch

from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.engine import BadBatch, Engine, OutOfBlocks
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels.quant import QuantError
from tokenrouter.runtime.memory import release_load_temporaries


@pytest.fixture
def llama(tiny):
    return tiny("llama")


def test_bad_batches_raise_clear_errors_and_change_nothing(llama):
    _, cfg, sd = llama
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=8, max_model_len=24))
    cases = [
        ([], "empty batch"),
        ([("a", [1]), ("a", [2])], "twice"),
        ([("a", [])], "no new tokens"),
        ([("a", [cfg.vocab_size])], "out of range"),
        ([("a", [-1])], "out of range"),
        ([("a", [1] * 25)], "max_model_len"),
    ]
    for batch, msg in cases:
        with pytest.raises(BadBatch, match=msg):
            eng.step(batch)
    with pytest.raises(BadBatch, match="hidden layers"):
        eng.step([("a", [1])], FeatureNeeds(hidden_layers=(cfg.num_hidden_layers + 1,)))
    assert eng.blocks_used == 0 and eng.seq_len("a") == 0


def test_out_of_blocks_is_refused_before_any_change(llama):
    _, cfg, sd = llama
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=5))
    eng.step([("a", [1] * 12)])  # 3 blocks
    assert eng.blocks_used == 3
    assert eng.can_append([("a", [2] * 8)])  # exactly 2 more
    assert not eng.can_append([("a", [2] * 9)])
    assert not eng.can_append([("a", [2] * 4), ("b", [3] * 5)])
    with pytest.raises(OutOfBlocks):
        eng.step([("a", [2] * 4), ("b", [3] * 5)])
    assert eng.blocks_used == 3 and eng.seq_len("a") == 12 and eng.seq_len("b") == 0
    eng.free("a")
    eng.free("never-seen")
    assert eng.blocks_used == 0 and eng.blocks_total == 5


def test_a_pending_sequence_keeps_its_blocks_under_pressure(llama):
    """A sequence holds its blocks until it is freed (how a request pending at a peer keeps
    its KV): others get only free blocks, or OutOfBlocks, and its cache stays intact."""
    _, cfg, sd = llama
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=6))
    eng.step([("p", [4, 5, 6, 7, 8])])
    before = eng.step([("p", [9])]).logits  # p is now pending at a peer
    table = eng.alloc.block_table("p")
    assert eng.blocks_used == 2 and eng.seq_len("p") == 6
    assert not eng.can_append([("q", [1] * 17)])  # only 4 blocks are free
    with pytest.raises(OutOfBlocks):
        eng.step([("q", [1] * 17)])
    for sid, tok in (("q", 1), ("q2", 3)):  # every free block, twice over
        eng.step([(sid, [tok] * 16)])
        assert eng.blocks_used == 6 and not set(eng.alloc.block_table(sid)) & set(table)
        eng.free(sid)
    assert eng.blocks_used == 2 and eng.alloc.block_table("p") == table and eng.seq_len("p") == 6
    after = eng.step([("p", [10])]).logits  # p returns: a one-token extend of its own cache
    eng.free("p")
    assert eng.blocks_used == 0
    # a fresh run of the same tokens gives the same logits (p's cache was never overwritten)
    eng.step([("r", [4, 5, 6, 7, 8])])
    torch.testing.assert_close(eng.step([("r", [9])]).logits, before, rtol=0, atol=0)
    torch.testing.assert_close(eng.step([("r", [10])]).logits, after, rtol=0, atol=0)


def test_prefix_reuse_shares_blocks_and_changes_no_logits(llama):
    _, cfg, sd = llama
    shared = list(range(1, 14))  # 13 tokens: 3 full blocks of 4
    plain = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=32))
    reuse = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=32, prefix_reuse=True))
    for eng in (plain, reuse):
        eng.step([("a", shared + [20, 21])])
    used = reuse.blocks_used
    out_r = reuse.step([("b", shared + [30, 31, 32])])
    out_p = plain.step([("b", shared + [30, 31, 32])])
    torch.testing.assert_close(out_r.logits, out_p.logits, rtol=0, atol=1e-10)
    assert used == 4  # a: 15 tokens, 3 full blocks + 1 partial
    assert reuse.blocks_used - used == 1  # b: 16 tokens = 4 blocks, the first 3 shared with a
    reuse.free("a")
    reuse.free("b")
    assert reuse.blocks_used == 0
    # freed blocks stay matchable until reallocated (c's last block is computed afresh)
    out_c = reuse.step([("c", shared + [30, 31, 32])])
    torch.testing.assert_close(out_c.logits, out_p.logits, rtol=0, atol=1e-10)
    assert reuse.blocks_used == 4


def test_chunked_long_prefill_equals_one_forward(llama):
    _, cfg, sd = llama
    toks = [(7 * i) % cfg.vocab_size for i in range(50)]
    a = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=32, max_batched_tokens=7))
    b = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=32))
    needs = FeatureNeeds(hidden_layers=(0, 2, -1))
    oa, ob = a.step([("x", toks), ("y", toks[:9])], needs), b.step([("x", toks), ("y", toks[:9])], needs)
    torch.testing.assert_close(oa.logits, ob.logits, rtol=0, atol=1e-10)
    for k in needs.hidden_layers:
        torch.testing.assert_close(oa.hidden[k], ob.hidden[k], rtol=0, atol=1e-10)


def test_default_cache_size_holds_a_full_sequence(llama):
    _, cfg, sd = llama
    eng = Engine(cfg, sd, EngineOptions(block_size=16, max_model_len=200))
    assert eng.blocks_total * 16 >= 200
    assert eng.max_model_len == 200


def test_options_default_to_what_an_engine_without_them_runs(llama):
    """`EngineOptions()` is the engine's defaults; they are frozen, and the engine keeps them."""
    o = EngineOptions()
    assert (o.device, o.dtype, o.block_size, o.num_blocks, o.max_model_len, o.prefix_reuse, o.max_batched_tokens,
            o.cuda_graphs, o.quant, o.act_dtype, o.head_quant, o.kernel_plan, o.plan_cache, o.attention,
            o.fused_ops, o.kv_dtype, o.decode_stack) == ("cpu", torch.float32, 16, None, None, False, 2048, True, "none",
                                                         torch.bfloat16, "auto", None, None, None, None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.block_size = 4
    _, cfg, sd = llama
    eng = Engine(cfg, {k: v.float() for k, v in sd.items()})
    assert eng.options == o and eng.block_size == 16 and eng.dtype == torch.float32 and eng.quant == "none"
    assert eng.max_model_len == cfg.max_position_embeddings and eng.graphs is None


def test_a_quantised_model_off_the_cpu_is_refused_naming_the_device(llama):
    _, cfg, sd = llama
    with pytest.raises(QuantError, match=r"use quant=none on cuda$"):
        Engine(cfg, sd, EngineOptions(device="cuda", quant="int4"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim; RSS from /proc")
def test_release_load_temporaries_hands_freed_heap_back():
    """What loading frees stays in glibc's arenas (RSS) until trimmed: 64 KiB buffers, under
    glibc's mmap threshold, freed below a live one that pins the heap's top."""
    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    bufs = [np.ones(8192) for _ in range(4000)]  # 250 MiB
    keep = bufs[-1]
    del bufs
    before = rss_mb()
    assert release_load_temporaries()
    assert rss_mb() < before - 150, "the freed buffers were not handed back"
    assert keep.sum() == 8192
