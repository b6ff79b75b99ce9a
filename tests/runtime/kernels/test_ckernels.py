"""The C attention kernel (`kernels/bindings.py`, built on this host with its C compiler by
`kernels/build.py`): it agrees with torch's path on random steps, gives each request the
same bits in any batch, serves an engine that matches `transformers`, and, where it cannot
be built, the engine says why (`attention="native"`) or keeps torch's path (`"auto"`)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrouter.runtime.engine import attention
from tokenrouter.runtime.kernels import build
from tokenrouter.runtime.engine.attention import SHORT_Q, CacheGeometry, build_meta, paged_attention
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.engine.kv_cache import KVCache

from tests.helpers.hf_parity import hf_logits

pytestmark = pytest.mark.skipif(build.available() is not None,
                                reason=f"no C kernel on this host: {build.available()}")


def _setup(kv_heads: int, group: int, head_dim: int, block_size: int, reqs: list[tuple[int, int]], seed: int):
    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=head_dim * kv_heads * group,
                      intermediate_size=16, num_hidden_layers=2, num_attention_heads=kv_heads * group,
                      num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=1e4,
                      max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False, qk_norm=False)
    need = sum(-(-n // block_size) for _, n in reqs)
    blocks = need + 3
    kv = KVCache(cfg, blocks, block_size, "cpu", torch.float32)
    g = torch.Generator().manual_seed(seed)
    kv.kv.copy_(torch.randn(kv.kv.shape, generator=g))
    geo = CacheGeometry(block_size, blocks, kv_heads, group)
    order = random.Random(seed).sample(range(blocks), blocks)  # scattered blocks, as a busy cache has
    tables, k = [], 0
    for _, n in reqs:
        nb = -(-n // block_size)
        tables.append(order[k:k + nb])
        k += nb
    t = sum(q for q, _ in reqs)
    # q as the model passes it: the query heads of a wider qkv row (a strided view)
    qkv = torch.randn(t, kv_heads * (group + 2), head_dim, generator=g)
    return kv, geo, tables, qkv[:, :kv_heads * group]


def _meta(reqs, tables, geo, native):
    return build_meta([q for q, _ in reqs], [n for _, n in reqs], tables, [0] * sum(q for q, _ in reqs), geo,
                      torch.float32, "cpu", native=native)


steps = st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 3, SHORT_Q, SHORT_Q + 4]), st.integers(0, 90)),
                 min_size=1, max_size=6).map(lambda rs: [(q, q + extra) for q, extra in rs])


@settings(max_examples=40, deadline=None)
@given(reqs=steps, kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 3, 4, 9]),
       head_dim=st.sampled_from([8, 12, 64]), block_size=st.sampled_from([1, 4, 16]), seed=st.integers(0, 99))
def test_the_c_kernel_agrees_with_torchs_attention_on_random_steps(reqs, kv_heads, group, head_dim, block_size, seed):
    """Decodes, short extends and prefill chunks in one step, grouped-query heads (9 per KV
    head and head_dim 12 take the scalar code), scattered blocks of size 1 to 16."""
    kv, geo, tables, q = _setup(kv_heads, group, head_dim, block_size, reqs, seed)
    ours = paged_attention(q, kv, 1, _meta(reqs, tables, geo, native=True), head_dim ** -0.5)
    ref = paged_attention(q, kv, 1, _meta(reqs, tables, geo, native=False), head_dim ** -0.5)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=2e-6)


def test_the_c_kernel_gives_each_request_the_same_bits_in_any_batch():
    reqs = [(1, 9), (3, 150), (1, 61), (5, 40), (1, 300), (12, 12), (20, 70)]
    kv, geo, tables, q = _setup(2, 3, 64, 4, reqs, seed=0)
    together = paged_attention(q, kv, 0, _meta(reqs, tables, geo, native=True), 0.125)
    start = 0
    for i, (n_new, n) in enumerate(reqs):
        alone = paged_attention(q[start:start + n_new].clone(), kv, 0, _meta([(n_new, n)], [tables[i]], geo, True), 0.125)
        assert torch.equal(together[start:start + n_new], alone), f"request {i} ({n_new} new, context {n})"
        start += n_new


def test_an_engine_on_the_c_kernel_matches_transformers_in_float32(tiny):
    model, cfg, sd = tiny("qwen2")
    eng = Engine(cfg, {k: v.float() for k, v in sd.items()},
                 EngineOptions(dtype=torch.float32, block_size=4, num_blocks=64, attention="native"))
    assert eng.native_attention
    prompts = {"a": list(range(3, 15)), "b": [5, 6], "c": list(range(40, 61))}
    toks = {s: list(p) for s, p in prompts.items()}
    out = eng.step(list(prompts.items()))
    for _ in range(10):
        for i, s in enumerate(prompts):
            torch.testing.assert_close(out.logits[i].double(), hf_logits(model, toks[s])[-1], rtol=0, atol=2e-4)
        nxt = out.logits.argmax(-1).tolist()
        for s, t in zip(prompts, nxt):
            toks[s].append(t)
        out = eng.step([(s, [t]) for s, t in zip(prompts, nxt)])


def test_without_a_compiler_native_attention_says_why_and_auto_keeps_torchs_path(tiny, monkeypatch, tmp_path):
    _, cfg, sd = tiny("llama")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_lib", None)
    monkeypatch.setattr(build, "_error", None)
    f32 = {k: v.float() for k, v in sd.items()}
    with pytest.raises(build.NativeKernelError, match="no-such-cc"):
        Engine(cfg, f32, EngineOptions(dtype=torch.float32, block_size=4, num_blocks=16, attention="native"))
    eng = Engine(cfg, f32, EngineOptions(dtype=torch.float32, block_size=4, num_blocks=16))
    assert not eng.native_attention
    assert eng.step([("a", [1, 2, 3])]).logits.shape == (1, cfg.vocab_size)
    with pytest.raises(ValueError, match="float32"):
        Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=16, attention="native"))
    with pytest.raises(ValueError, match="auto, native or torch"):
        Engine(cfg, f32, EngineOptions(dtype=torch.float32, block_size=4, num_blocks=16, attention="fast"))


def test_the_measured_choice_is_timed_once_and_then_read_from_its_cache(tmp_path):
    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=64, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4,
                      max_position_embeddings=2048, tie_word_embeddings=True, attention_bias=False, qk_norm=False)
    kv = KVCache(cfg, 600, 16, "cpu", torch.float32)
    path = tmp_path / "choice.json"
    first = attention.prefer_native(kv, CacheGeometry(16, 600, 2, 2), 4, 2, str(path))
    data = json.loads(path.read_text())
    assert data["native"] is first
    assert set(data["ms_per_step"]["native"]) == {f"{b}x{n}" for b, n in attention.CHOICE_SHAPES}
    path.write_text(json.dumps({**data, "native": not first}))  # a cached choice is not measured again
    assert attention.prefer_native(kv, CacheGeometry(16, 600, 2, 2), 4, 2, str(path)) is (not first)
    # a cache that holds none of the timed shapes decides nothing for a larger one
    tiny = tmp_path / "tiny.json"
    assert attention.prefer_native(KVCache(cfg, 8, 16, "cpu", torch.float32), CacheGeometry(16, 8, 2, 2), 4, 2,
                                   str(tiny)) is False
    assert not tiny.exists()
