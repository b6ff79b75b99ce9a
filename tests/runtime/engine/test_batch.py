"""A mixed batch gives every request the logits it gets alone (and the reference's)."""

from __future__ import annotations

import random

import pytest
import torch

from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.attention import CacheGeometry, build_meta, paged_attention
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.kv_cache import KVCache
from tokenrouter.runtime.engine.options import EngineOptions

from tests.helpers.hf_parity import hf_logits


def _engine(cfg, sd, **kw):
    return Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=128, **kw))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_mixed_batch_equals_each_request_alone(tiny, family):
    model, cfg, sd = tiny(family)
    rng = random.Random(1)
    seqs = {s: [rng.randrange(cfg.vocab_size) for _ in range(40)] for s in "abcde"}
    # per request: tokens already in the cache, then this step's new tokens
    plan = {"a": (0, 13),   # fresh prefill
            "b": (10, 1),   # decode
            "c": (7, 3),    # short extend (a returning request)
            "d": (0, 37),   # long prefill, chunked by max_batched_tokens below
            "e": (20, 1)}   # another decode
    needs = FeatureNeeds(hidden_layers=(1, -1))
    batched = _engine(cfg, sd, max_batched_tokens=16)
    for s, (have, _) in plan.items():
        if have:
            batched.step([(s, seqs[s][:have])])
    out = batched.step([(s, seqs[s][have:have + k]) for s, (have, k) in plan.items()], needs)
    for i, (s, (have, k)) in enumerate(plan.items()):
        alone = _engine(cfg, sd)
        if have:
            alone.step([(s, seqs[s][:have])])
        one = alone.step([(s, seqs[s][have:have + k])], needs)
        torch.testing.assert_close(out.logits[i], one.logits[0], rtol=0, atol=1e-10)
        for layer in needs.hidden_layers:
            torch.testing.assert_close(out.hidden[layer][i], one.hidden[layer][0], rtol=0, atol=1e-10)
        ref = hf_logits(model, seqs[s][:have + k])[-1]
        torch.testing.assert_close(out.logits[i], ref, rtol=0, atol=1e-10)
    for s, (have, k) in plan.items():
        assert batched.seq_len(s) == have + k
        batched.free(s)
    assert batched.blocks_used == 0


def test_batched_greedy_generation_matches_reference(tiny):
    """Several requests of different lengths decoded together, token by token."""
    model, cfg, sd = tiny("qwen3")
    eng = _engine(cfg, sd)
    prompts = {0: [1, 2, 3], 1: list(range(10, 30)), 2: [7]}
    toks = {i: list(p) for i, p in prompts.items()}
    out = eng.step([(i, p) for i, p in prompts.items()])
    for _ in range(8):
        nxt = out.logits.argmax(-1).tolist()
        for i, t in zip(prompts, nxt):
            toks[i].append(t)
        out = eng.step([(i, [t]) for i, t in zip(prompts, nxt)])
    for i in prompts:
        ref = hf_logits(model, toks[i])[len(prompts[i]) - 1:-1].argmax(-1).tolist()
        assert toks[i][len(prompts[i]):] == ref


def test_paged_attention_gives_each_request_the_same_bits_in_any_batch():
    """Batch invariance, bit for bit, in float32: a request's attention output must not depend
    on the lengths of the requests sharing its step. Padding it to a neighbour's context or
    new-token count changes the rounding of the products (by ~1e-7), which a bfloat16
    quantised layer after it turns into one-ulp flips and, on SmolLM2, different tokens."""

    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=64 * 6, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                      rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=512, tie_word_embeddings=True,
                      attention_bias=False, qk_norm=False)
    bs, blocks = 4, 200
    kv = KVCache(cfg, blocks, bs, "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    kv.kv.copy_(torch.randn(kv.kv.shape, generator=g))
    geo = CacheGeometry(bs, blocks, cfg.num_key_value_heads, 3)
    # (new tokens, context after the step): decodes, short extends, a prefill chunk
    reqs = [(1, 9), (3, 150), (1, 61), (5, 40), (1, 300), (12, 12), (20, 70)]
    tables, next_block = [], 0
    for _, n in reqs:
        nb = -(-n // bs)
        tables.append(list(range(next_block, next_block + nb)))
        next_block += nb

    def slots(i):
        q, n = reqs[i]
        return [tables[i][p // bs] * bs + p % bs for p in range(n - q, n)]

    t = sum(q for q, _ in reqs)
    q_all = torch.randn(t, cfg.num_attention_heads, 64, generator=g)
    meta = build_meta([q for q, _ in reqs], [n for _, n in reqs], tables, [s for i in range(len(reqs)) for s in slots(i)],
                      geo, torch.float32, "cpu")
    together = paged_attention(q_all, kv, 0, meta, 0.125)
    start = 0
    for i, (q, n) in enumerate(reqs):
        one = build_meta([q], [n], [tables[i]], slots(i), geo, torch.float32, "cpu")
        alone = paged_attention(q_all[start:start + q].clone(), kv, 0, one, 0.125)
        assert torch.equal(together[start:start + q], alone), f"request {i} (q={q}, context {n})"
        start += q
