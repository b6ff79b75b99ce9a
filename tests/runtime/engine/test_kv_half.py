"""A half-precision KV cache (`kv_dtype`: float16 or bfloat16; a quantised model's default on
CPU, `kv_cache.half_kv_dtype`).

Its tolerance: K and V are stored rounded to nearest even (relative step u = 2^-11 for
float16, 2^-8 for bfloat16) and read back exactly, so attention computes on values within
u of the float32 ones: to first order an output moves by at most u max|v| (the values) plus
2 u max_j scale sum_d |q_d k_jd| max|v| (the scores, through the softmax). Over SmolLM2's
808 teacher-forced positions the greedy tokens keep their agreement with the float32 engine
(`test_quant_real_weights.py`, cases with a float16 or bfloat16 cache)."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.attention import CacheGeometry, build_meta, paged_attention
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.kv_cache import KVCache, half_kv_dtype
from tokenrouter.runtime.engine.layers import Rotary
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.host import cpu_flags
from tokenrouter.runtime.kernels import bindings, build

pytestmark = pytest.mark.skipif(build.available() is not None,
                                reason=f"no C kernel on this host: {build.available()}")
HALVES = [torch.float16, torch.bfloat16]
STEP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _cfg(kv_heads=2, group=3, hd=64):
    return ModelConfig(architecture="llama", vocab_size=32, hidden_size=hd * kv_heads * group, intermediate_size=16,
                       num_hidden_layers=2, num_attention_heads=kv_heads * group, num_key_value_heads=kv_heads,
                       head_dim=hd, rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=512,
                       tie_word_embeddings=True, attention_bias=False, qk_norm=False)


@pytest.mark.parametrize("dtype", HALVES)
def test_rope_write_into_a_half_cache_stores_the_float32_values_rounded(dtype):
    cfg = _cfg()
    g = torch.Generator().manual_seed(1)
    rows, nh, kvh, hd = 7, 6, 2, 64
    qkv = torch.randn(rows, (nh + 2 * kvh) * hd, generator=g) * 50
    positions, slots = torch.randint(0, 256, (rows,), generator=g), torch.randperm(32, generator=g)[:rows]
    cis = torch.view_as_real(Rotary(hd, 1e4, None, 256, "cpu", torch.float32).cis)
    caches = {}
    for dt in (torch.float32, dtype):
        kv = KVCache(cfg, 8, 4, "cpu", dt)
        q = torch.empty(rows, nh * hd)
        bindings.rope_write(qkv, nh, kvh, cis, positions, None, 1e-6, kv.layers[1], slots, q)
        caches[dt] = (kv.kv, q)
    assert torch.equal(caches[dtype][0], caches[torch.float32][0].to(dtype))  # torch's round-to-nearest-even
    assert torch.equal(caches[dtype][1], caches[torch.float32][1])  # q stays float32


def _setup(dtype, reqs, seed=0):
    cfg = _cfg()
    blocks = sum(-(-n // 4) for _, n in reqs) + 2
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(2, 4, blocks, 4, 64, generator=g) * 3
    kv32, kvh = KVCache(cfg, blocks, 4, "cpu", torch.float32), KVCache(cfg, blocks, 4, "cpu", dtype)
    kv32.kv.copy_(full)
    kvh.kv.copy_(full.to(dtype))
    tables, k = [], 1
    for _, n in reqs:
        tables.append(list(range(k, k + -(-n // 4))))
        k += -(-n // 4)
    q = torch.randn(sum(t for t, _ in reqs), 6, 64, generator=g)
    return kv32, kvh, CacheGeometry(4, blocks, 2, 3), tables, q


def _meta(reqs, tables, geo, native):
    return build_meta([t for t, _ in reqs], [n for _, n in reqs], tables, [0] * sum(t for t, _ in reqs), geo,
                      torch.float32, "cpu", native=native)


@pytest.mark.parametrize("dtype", HALVES)
def test_attention_on_a_half_cache_is_attention_on_its_values_and_within_the_stated_tolerance(dtype):
    """The C kernel reads the half cache as its exact float32 values (the same bits as the
    kernel on those values widened), torch's path agrees with it to float rounding, and the
    output is within the first-order bound of the float32 cache's."""
    reqs = [(1, 9), (3, 150), (1, 61), (20, 70)]  # decodes, a short extend, a prefill chunk
    kv32, kvh, geo, tables, q = _setup(dtype, reqs)
    widened = KVCache(_cfg(), geo.num_blocks, 4, "cpu", torch.float32)
    widened.kv.copy_(kvh.kv.float())
    scale = 0.125
    half_c = paged_attention(q, kvh, 0, _meta(reqs, tables, geo, True), scale)
    assert torch.equal(half_c, paged_attention(q, widened, 0, _meta(reqs, tables, geo, True), scale))
    half_torch = paged_attention(q, kvh, 0, _meta(reqs, tables, geo, False), scale)
    u, vmax = STEP[dtype], kv32.kv[0, 2:].abs().max()
    # float rounding: the two sum the weighted values in other orders (seen: 2.7e-6, 2.8 ulps of
    # the largest value, on an AMX Xeon), so within 8 float32 ulps of the largest value
    torch.testing.assert_close(half_c, half_torch, rtol=0, atol=8 * torch.finfo(torch.float32).eps * float(vmax))
    exact = paged_attention(q, kv32, 0, _meta(reqs, tables, geo, True), scale)
    kmax = kv32.kv[0, :2].abs().max()
    smax = scale * q.abs().sum(-1).max() * kmax  # a bound on scale sum_d |q_d k_jd|
    bound = u * vmax + 2 * u * smax * vmax
    assert (half_c - exact).abs().max() <= bound
    assert (half_c - exact).abs().max() > 0  # the cache did round


def test_the_default_cache_is_half_precision_for_quantised_models_only(tiny):
    _, cfg, sd = tiny("llama")
    f32 = {k: v.float() for k, v in sd.items()}
    opts = dict(block_size=4, num_blocks=16, max_model_len=64)
    assert Engine(cfg, f32, EngineOptions(**opts)).kv.kv.dtype == torch.float32
    quant = Engine(cfg, f32, EngineOptions(quant="int8", **opts))
    assert quant.kv.kv.dtype == half_kv_dtype(cpu_flags())
    assert Engine(cfg, f32, EngineOptions(quant="int8", kv_dtype="float32", **opts)).kv.kv.dtype == torch.float32
    assert Engine(cfg, f32, EngineOptions(kv_dtype="bfloat16", **opts)).kv.kv.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="kv_dtype must be one of float32, float16, bfloat16"):
        Engine(cfg, f32, EngineOptions(kv_dtype="int8", **opts))
    with pytest.raises(ValueError, match="kv_dtype=float16 runs with float32 models on CPU"):
        Engine(cfg, sd, EngineOptions(dtype=torch.float64, kv_dtype="float16", **opts))


def test_half_kv_dtype_follows_the_cpus_flags():
    assert half_kv_dtype("fpu sse2 avx2 f16c fma") == torch.float16
    assert half_kv_dtype("fpu sse2 avx2 fma") == torch.bfloat16
    assert half_kv_dtype("") == torch.bfloat16


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_engine_on_a_half_cache_follows_the_float32_cache(tiny, dtype):
    """A float32 model with a half cache, torch's path and the C kernel alike: logits within
    2e-2 of the float32 cache's over prefill, extends and decodes. (The two paths round K's
    rotation differently in float32, and a one-ulp difference can move a value across a half
    rounding boundary, so they differ from each other by the cache's step too.)"""
    _, cfg, sd = tiny("qwen3")
    f32 = {k: v.float() for k, v in sd.items()}
    outs = []
    for kv, attention in (("float32", "native"), (dtype, "native"), (dtype, "torch")):
        eng = Engine(cfg, f32, EngineOptions(block_size=4, num_blocks=64, kv_dtype=kv, attention=attention))
        toks = {"a": list(range(3, 20)), "b": [5, 6, 7]}
        out = eng.step(list(toks.items()))
        logits = [out.logits]
        for step in range(8):
            out = eng.step([(s, [(step * 7 + i) % cfg.vocab_size] * (1 + step % 2)) for i, s in enumerate(toks)])
            logits.append(out.logits)
        outs.append(torch.stack(logits))
    ref, c_half, torch_half = outs
    for half in (c_half, torch_half):
        assert 0 < (half - ref).abs().max() <= 2e-2 * ref.abs().max()
