"""The C element-wise ops of a quantised model's forward (`csrc/decode_ops.c`) against torch's
ops on random inputs, each within its stated tolerance, and the fused forward against the
unfused one: close logits and hidden states, the same bits for a request in any batch, and a
clear error where it cannot run.

Tolerances: a residual add is exact (the same float32 sum); RMSNorm's output may differ from
torch's by one bfloat16 step (the sum of squares is added in another order, in double, which
can move a value across a bf16 rounding boundary); SwiGLU likewise (another exp, relative
error under 1e-7 before rounding); RoPE and the K/V write by float32 rounding (2e-6)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.kv_cache import KVCache
from tokenrouter.runtime.engine.layers import Rotary
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels import bindings, build
from tokenrouter.runtime.loader import load_model

pytestmark = pytest.mark.skipif(build.available() is not None,
                                reason=f"no C kernel on this host: {build.available()}")

BF16_STEP = 2.0 ** -7  # one bfloat16 step, relative (8 significant bits)


def _within_one_bf16_step(got: torch.Tensor, ref: torch.Tensor) -> None:
    g, r = got.float(), ref.float()
    bound = BF16_STEP * r.abs() + 1e-30
    assert ((g - r).abs() <= bound).all(), f"max |diff| {(g - r).abs().max():.3g}"


DTYPES = st.sampled_from([torch.bfloat16, torch.float32])


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16: one bf16 step; float32: float rounding."""
    if got.dtype == torch.bfloat16:
        _within_one_bf16_step(got, ref)
    else:
        torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), cols=st.sampled_from([8, 24, 64, 576]), y_kind=st.sampled_from(["bf16", "f32", None]),
       norm=st.booleans(), out_dtype=DTYPES, seed=st.integers(0, 10_000))
def test_add_rmsnorm_is_torchs_add_then_rms_norm(rows, cols, y_kind, norm, out_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, cols, generator=g) * 3
    w = torch.randn(cols, generator=g)
    y = None if y_kind is None else torch.randn(rows, cols, generator=g).to(
        torch.bfloat16 if y_kind == "bf16" else torch.float32)
    ref_h = h if y is None else h + y.float()
    out = torch.empty(rows, cols, dtype=out_dtype) if norm else None
    bindings.add_rmsnorm(h, y, w if norm else None, 1e-5, out)
    assert torch.equal(h, ref_h)  # the residual add is exact
    if norm:
        _close(out, F.rms_norm(ref_h, (cols,), w, 1e-5).to(out_dtype))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), inter=st.sampled_from([4, 16, 1536]), in_dtype=DTYPES, out_dtype=DTYPES,
       seed=st.integers(0, 10_000))
def test_silu_mul_is_torchs_swiglu(rows, inter, in_dtype, out_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    gu = (torch.randn(rows, 2 * inter, generator=g) * 4).to(in_dtype)
    gu[0, 0] = -200.0  # far outside exp's range: silu is -0, not NaN
    out = torch.empty(rows, inter, dtype=out_dtype)
    bindings.silu_mul(gu, out)
    gate, up = gu.float().chunk(2, dim=-1)
    _close(out, (F.silu(gate) * up).to(out_dtype))
    assert not out.isnan().any()


def _geometry(kv_heads, group, hd, qk_norm):
    return ModelConfig(architecture="qwen3" if qk_norm else "llama", vocab_size=32, hidden_size=64,
                       intermediate_size=16, num_hidden_layers=2, num_attention_heads=kv_heads * group,
                       num_key_value_heads=kv_heads, head_dim=hd, rms_norm_eps=1e-6, rope_theta=1e4,
                       max_position_embeddings=256, tie_word_embeddings=True, attention_bias=False, qk_norm=qk_norm)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 20), kv_heads=st.integers(1, 3), group=st.integers(1, 3), hd=st.sampled_from([4, 16, 64]),
       bf16=st.booleans(), qk_norm=st.booleans(), seed=st.integers(0, 10_000))
def test_rope_write_is_torchs_rotation_and_cache_write(rows, kv_heads, group, hd, bf16, qk_norm, seed):
    """The same values as the model's torch path: optional per-head RMSNorm, `Rotary.apply_`
    on q and k, `KVCache.write` of k and v at their slots."""
    g = torch.Generator().manual_seed(seed)
    cfg = _geometry(kv_heads, group, hd, qk_norm)
    nh = kv_heads * group
    qkv = torch.randn(rows, (nh + 2 * kv_heads) * hd, generator=g)
    if bf16:
        qkv = qkv.to(torch.bfloat16)
    positions = torch.randint(0, 256, (rows,), generator=g)
    slots = torch.randperm(8 * 4, generator=g)[:rows]
    norm_w = torch.randn(nh + kv_heads, hd, generator=g) if qk_norm else None
    rot = Rotary(hd, 1e4, None, 256, "cpu", torch.float32)

    ref_kv = KVCache(cfg, 8, 4, "cpu", torch.float32)
    x = qkv.float().view(rows, nh + 2 * kv_heads, hd).clone()
    qk = x[:, :nh + kv_heads]
    if qk_norm:
        torch.mul(F.rms_norm(qk, (hd,), None, 1e-6), norm_w, out=qk)
    rot.apply_(qk, rot.tables(positions))
    ref_kv.write(1, slots, x[:, nh:])

    kv = KVCache(cfg, 8, 4, "cpu", torch.float32)
    q = torch.empty(rows, nh * hd)
    bindings.rope_write(qkv, nh, kv_heads, torch.view_as_real(rot.cis), positions, norm_w, 1e-6, kv.layers[1],
                        slots, q)
    torch.testing.assert_close(q, x[:, :nh].reshape(rows, -1), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(kv.kv, ref_kv.kv, rtol=2e-6, atol=2e-6)


def test_the_ops_refuse_tensors_they_would_read_out_of_bounds():
    h = torch.randn(3, 8)
    with pytest.raises(ValueError, match="out must be a CPU torch.bfloat16"):
        bindings.add_rmsnorm(h, None, torch.ones(8), 1e-5, torch.empty(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must be a CPU torch.float32"):
        bindings.add_rmsnorm(h, None, torch.ones(8), 1e-5, torch.empty(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="w must be a contiguous float32"):
        bindings.add_rmsnorm(h, None, torch.ones(4), 1e-5, torch.empty(3, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="gate_up must be"):
        bindings.silu_mul(torch.empty(3, 8, dtype=torch.bfloat16), torch.empty(3, 8, dtype=torch.bfloat16))


# ------------------------------------------------------------------ the fused forward

VOCAB = 272


def _model(tmp_path, family):
    config = hf_config(family, vocab=VOCAB)
    path = str(tmp_path / f"{family}.gguf")
    write_gguf(path, transformers_model(config, seed=11), config, qtype="Q4_1")
    return load_model(path, quant="native")


def _engine(m, **kw):
    kw.setdefault("kernel_plan", "int4")
    return Engine(m.config, m.weights,
                  EngineOptions(block_size=4, num_blocks=64, max_model_len=128, quant="native", **kw))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_the_fused_forward_follows_the_unfused_one(tmp_path, family):
    """Prefill then decode, bf16 activations: logits and a router's hidden states stay within
    1% of the largest logit (measured: at most 0.16%; the difference is rounding, amplified by later layers)."""
    m = _model(tmp_path, family)
    fused, plain = _engine(m), _engine(m, fused_ops=False)
    assert fused.model.fused and not plain.model.fused
    needs = FeatureNeeds(hidden_layers=(0, 1, -1))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 3, 14)]
    a = fused.step([(i, p) for i, p in enumerate(prompts)], needs)
    b = plain.step([(i, p) for i, p in enumerate(prompts)], needs)
    for _ in range(4):
        scale = b.logits.abs().max()
        assert (a.logits - b.logits).abs().max() <= 0.01 * scale  # measured: at most 0.0016
        for k in needs.hidden_layers:
            assert (a.hidden[k] - b.hidden[k]).abs().max() <= 0.01 * b.hidden[k].abs().max() + 1e-6
        nxt = b.logits.argmax(-1).tolist()
        a = fused.step([(i, [t]) for i, t in enumerate(nxt)], needs)
        b = plain.step([(i, [t]) for i, t in enumerate(nxt)], needs)


def test_the_fused_forward_gives_a_request_the_same_bits_in_any_batch(tmp_path):
    m = _model(tmp_path, "qwen3")  # qk-norm, the longest C path
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, VOCAB, (30,), generator=g).tolist() for _ in range(4)]
    steps = {0: (0, 11), 1: (9, 1), 2: (5, 3), 3: (17, 1)}
    batched = _engine(m)
    assert batched.model.fused
    for s, (have, _) in steps.items():
        if have:
            batched.step([(s, seqs[s][:have])])
    out = batched.step([(s, seqs[s][have:have + k]) for s, (have, k) in steps.items()]).logits
    for i, (s, (have, k)) in enumerate(steps.items()):
        alone = _engine(m)
        if have:
            alone.step([(s, seqs[s][:have])])
        assert torch.equal(out[i], alone.step([(s, seqs[s][have:have + k])]).logits[0]), f"request {s}"


def test_fused_ops_on_demand_says_why_it_cannot_run(tmp_path):
    m = _model(tmp_path, "llama")
    floats = load_model(str(tmp_path / "llama.gguf"))
    with pytest.raises(ValueError, match="fused_ops=True: the model is not quantised"):
        Engine(floats.config, floats.weights, EngineOptions(num_blocks=16, max_model_len=64, fused_ops=True))
    with pytest.raises(ValueError, match="fused_ops=True: matrices .* run a float kernel"):
        _engine(m, fused_ops=True, kernel_plan="onednn")
    assert not Engine(floats.config, floats.weights, EngineOptions(num_blocks=16, max_model_len=64)).model.fused


# ------------------------------------------------------------------ the head's rescoring

@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), v=st.sampled_from([16, 100, 4096]), k=st.sampled_from([1, 5, 16]),
       seed=st.integers(0, 10_000))
def test_rescore_top_recomputes_each_rows_top_candidates_from_the_codes(rows, v, k, seed):
    """The k highest logits of each row (the same set torch's topk finds) recomputed as the
    float64 product of the dequantised codes and h to float32 rounding; every other logit
    untouched; a row's result the same alone as in the batch."""
    g = torch.Generator().manual_seed(seed)
    hdim = 64
    codes = torch.randint(-127, 128, (v, hdim), generator=g, dtype=torch.int8)
    scales = torch.rand(v, hdim // 32, generator=g) * 0.01
    h = torch.randn(rows, hdim, generator=g)
    lg = torch.randn(rows, v, generator=g)
    before = lg.clone()
    bindings.rescore_top(lg, h, codes, scales, k)
    top = before.topk(k, dim=-1).indices
    w = (codes.double().view(v, hdim // 32, 32) * scales.double().unsqueeze(-1)).view(v, hdim)
    exact = torch.einsum("rkh,rh->rk", w[top], h.double())
    # float32 accumulation of hdim products: off by at most hdim ulps of the sum of their sizes
    # (a result near 0 from large terms cancels to far more than its own relative rounding)
    size = torch.einsum("rkh,rh->rk", w[top].abs(), h.double().abs())
    assert ((lg.gather(1, top).double() - exact).abs() <= hdim * 2.0 ** -24 * size + 1e-12).all()
    kept = torch.ones_like(lg, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(lg[kept], before[kept])
    for r in range(rows):
        alone = before[r:r + 1].clone()
        bindings.rescore_top(alone, h[r:r + 1].clone(), codes, scales, k)
        assert torch.equal(alone, lg[r:r + 1])


def test_rescore_top_skips_nans_and_breaks_ties_to_the_lower_index():
    codes = torch.ones(6, 32, dtype=torch.int8)
    scales = torch.arange(1, 7, dtype=torch.float32).view(6, 1)
    h = torch.ones(1, 32)
    lg = torch.tensor([[float("nan"), 2.0, 5.0, 5.0, 1.0, 5.0]])
    bindings.rescore_top(lg, h, codes, scales, 2)
    # the two highest are the 5.0s at 2 and 3 (not 5), NaN is never selected
    assert lg[0, 0].isnan() and lg[0, 1] == 2.0 and lg[0, 5] == 5.0
    assert lg[0, 2] == 32 * 3.0 and lg[0, 3] == 32 * 4.0
    with pytest.raises(ValueError, match="k must be in"):
        bindings.rescore_top(lg, h, codes, scales, 0)
