"""Quantised weights on tiny GGUF files the tests write: GGUF blocks map exactly onto torch's int4
kernel, a quantised engine batches like a float one, and bad inputs get clear errors."""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.checkpoints import hf_config, largest_logit_gap, transformers_model, write_gguf
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels.bindings import int4dp_problem
from tokenrouter.runtime.kernels.blocks import BlockRows
from tokenrouter.runtime.kernels.linear import PlannedParts
from tokenrouter.runtime.kernels.plan import row_invariant
from tokenrouter.runtime.kernels.quant import QuantError, QuantTensor, quantize_int4, quantize_int8
from tokenrouter.runtime.loader import LoadError, UnsupportedQuantization, load_model, quant_options

VOCAB = 272  # a multiple of 16, so the tied head is int4-runnable too


def _gguf(tmp_path, family="llama", qtype="Q4_1", seed=5, **cfg):
    config = {**hf_config(family, vocab=VOCAB), **cfg}
    model = transformers_model(config, seed=seed)
    path = str(tmp_path / f"{family}-{qtype}.gguf")
    write_gguf(path, model, config, qtype=qtype)
    return path


def _engine(m, **kw):
    return Engine(m.config, m.weights, EngineOptions(block_size=4, num_blocks=64, max_model_len=128, **kw))


def _prompts(n, length, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("fused_ops", [False, None])
@pytest.mark.parametrize("family,qtype", [("llama", "Q4_1"), ("qwen2", "Q4_1"), ("llama", "Q4_0")])
def test_native_int4_with_float32_activations_equals_the_dequantised_engine(tmp_path, tmp_cache, family, qtype,
                                                                           fused_ops):
    """Q4_1 (w = d q + m) is the int4 kernel's w = (q - 8) scale + zero with scale = d and
    zero = m + 8 d; Q4_0 is zero = 0. So the products agree with the float engine to rounding,
    on torch's element-wise path and on the C one (`fused_ops`, where it builds), whose norms
    round differently."""
    kernel = "int4"
    path = _gguf(tmp_path, family, qtype)
    ref = _engine(load_model(path))  # quant=none: the gguf package's dequantisation, float32
    native = load_model(path, quant="native")
    down = native.weights["model.layers.0.mlp.down_proj.weight"]  # the file's blocks, read in place
    assert isinstance(down, BlockRows) and isinstance(down.codes(), QuantTensor)
    eng = _engine(native, quant="native", act_dtype=torch.float32, kernel_plan=kernel, fused_ops=fused_ops)
    # every matrix, the tied Q4 head included, runs on the kernel
    assert {k for plan in eng.kernel_plans.values() for _, k in plan} == {kernel}
    assert largest_logit_gap(ref, eng, _prompts(3, 11), 4) < 1e-5


K_SHAPES = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64}  # K-quant blocks hold 256 inputs


@pytest.mark.parametrize("fused_ops", [False, None])
def test_native_q4_k_on_the_int4_kernel_equals_the_dequantised_engine(tmp_path, tmp_cache, fused_ops):
    """Q4_K (w = d sc q - dmin m per sub-block of 32) is group-32 int4 with scale = d sc and
    zero = 8 scale - dmin m: with float32 activations, the float engine's products to rounding."""
    path = _gguf(tmp_path, "llama", "Q4_K", **K_SHAPES)
    ref = _engine(load_model(path))
    native = load_model(path, quant="native")
    assert native.weights["model.layers.1.mlp.down_proj.weight"].source == "Q4_K"
    eng = _engine(native, quant="native", act_dtype=torch.float32, kernel_plan="int4", fused_ops=fused_ops)
    assert {k for plan in eng.kernel_plans.values() for _, k in plan} == {"int4"}
    assert largest_logit_gap(ref, eng, _prompts(3, 11), 3) < 1e-5


def test_a_q4_k_m_mix_runs_natively_with_q_k_and_v_in_two_formats(tmp_path, tmp_cache):
    """llama.cpp's Q4_K_M puts v and down projections in Q6_K: quant=native holds them as their
    codes (int8 with a float32 scale per 16, exactly the file's values), runs the Q4_K ones on
    int4, keeps q/k (Q4_K) and v (Q6_K) as two parts of one fused matrix, and with float32
    activations (the Q6_K parts then on a float kernel) matches the dequantised float engine."""
    path = _gguf(tmp_path, "llama", "Q4_K_M", **K_SHAPES)
    floats, native = load_model(path), load_model(path, quant="native")
    down, up = "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(native.weights[down].codes().dequantize(), floats.weights[down])
    assert native.weights[up].source == "Q4_K"
    eng = _engine(native, quant="native", act_dtype=torch.float32, kernel_plan="int4")
    kinds = {key: k for key, plan in eng.kernel_plans.items() for _, k in plan}
    assert kinds["1024x256:q4g32"] == "int4" and kinds["256x512:q8g16"] in ("onednn", "mkl", "linear")
    qkv = eng.model.layers[0].qkv
    assert isinstance(qkv, PlannedParts) and [p.key for p in qkv.parts] == ["384x256:q4g32", "128x256:q8g16"]
    ref = _engine(floats)
    p = _prompts(2, 9)
    a = ref.step([(i, x) for i, x in enumerate(p)]).logits
    b = eng.step([(i, x) for i, x in enumerate(p)]).logits
    assert (a - b).abs().max() < 1e-5


def test_gguf_blocks_unpack_to_the_gguf_package_dequantisation(tmp_path, tmp_cache):
    path = _gguf(tmp_path, "llama", "Q8_0")
    floats, native = load_model(path), load_model(path, quant="native")
    for name in ("model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        qt = native.weights[name].codes()
        assert qt.source == "Q8_0" and qt.codes.dtype == torch.int8
        assert torch.equal(qt.dequantize(), floats.weights[name])  # k rows un-permuted like the floats
    path = _gguf(tmp_path, "llama", "Q4_K", **K_SHAPES)
    floats, native = load_model(path), load_model(path, quant="native")
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.embed_tokens.weight"):
        qt = native.weights[name].codes()
        assert qt.source == "Q4_K" and qt.group == 32
        # (q - 8) scale + zero rounds once more than gguf's d sc q - dmin m
        torch.testing.assert_close(qt.dequantize(), floats.weights[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("plan", ["int4", "int4dp", "int4amx", "measured"])
def test_mixed_batch_in_a_quantised_engine_equals_each_request_alone(tmp_path, tmp_cache, plan):
    """Prefill, decode and short extends at different context lengths in one step give, bit
    for bit, what each gets alone (bfloat16 activations, where any rounding difference grows:
    the measured plan runs each shape on one row-invariant kernel, and attention pads each
    request to its own shape)."""
    why = int4dp_problem(amx=plan == "int4amx") if plan in ("int4dp", "int4amx") else None
    if why:
        pytest.skip(why)
    m = load_model(_gguf(tmp_path), quant="native")
    kernel_plan = None if plan == "measured" else plan
    seqs = _prompts(5, 40, seed=3)
    steps = {0: (0, 13), 1: (10, 1), 2: (7, 3), 3: (20, 1), 4: (33, 5)}
    batched = _engine(m, quant="native", kernel_plan=kernel_plan)
    for s, (have, _) in steps.items():
        if have:
            batched.step([(s, seqs[s][:have])])
    out = batched.step([(s, seqs[s][have:have + k]) for s, (have, k) in steps.items()]).logits
    for i, (s, (have, k)) in enumerate(steps.items()):
        alone = _engine(m, quant="native", kernel_plan=batched.kernel_plans)
        if have:
            alone.step([(s, seqs[s][:have])])
        one = alone.step([(s, seqs[s][have:have + k])]).logits[0]
        assert torch.equal(out[i], one), f"request {s}: max |diff| {(out[i] - one).abs().max():.3g}"


def test_a_measured_plan_runs_each_shape_on_one_row_invariant_kernel(tmp_path, tmp_cache):
    m = load_model(_gguf(tmp_path), quant="native")
    eng = _engine(m, quant="native")
    assert eng.kernel_plans
    for key, plan in eng.kernel_plans.items():
        assert len({k for _, k in plan}) == 1, f"{key} switches kernels with the row count: {plan}"
    for lin in eng.model.linears():
        (kernel,) = lin.impl
        assert row_invariant(lin, kernel)


def test_on_load_int4_and_int8_follow_the_float_model(tmp_path, tmp_cache):
    m = load_model(_gguf(tmp_path, qtype="F32"))
    p = _prompts(2, 9, seed=4)
    ref = _engine(m).step([(i, x) for i, x in enumerate(p)]).logits
    for quant in ("int4", "int8"):
        lg = _engine(m, quant=quant, head_quant="none").step([(i, x) for i, x in enumerate(p)]).logits
        assert (lg - ref).abs().max() < 0.1 * ref.abs().max()
    w = m.weights["model.layers.0.mlp.gate_proj.weight"]
    assert (quantize_int4(w).dequantize() - w).abs().max() <= (w.max() - w.min()) / 15  # half a step per group
    assert (quantize_int8(w).dequantize() - w).abs().max() <= w.abs().max() / 127


def test_a_matrix_on_the_int4_kernel_alone_keeps_no_float_copy(tmp_path, tmp_cache):
    m = load_model(_gguf(tmp_path), quant="native")
    eng = _engine(m, quant="native", kernel_plan="int4")
    lin = eng.model.layers[0].gate_up
    assert set(lin.impl) == {"int4"} and lin.source is None


def test_unsupported_block_type_names_the_tensor_and_the_type(tmp_path, tmp_cache):
    path = _gguf(tmp_path, qtype="TQ1_0", **K_SHAPES)  # ternary blocks: no row reader here
    with pytest.raises(UnsupportedQuantization, match=r"GGUF tensor .token_embd\.weight. is stored as TQ1_0"):
        load_model(path, quant="native")
    assert load_model(path).weights  # quant=none still dequantises it


def test_int4_on_an_unsupported_shape_names_the_shape(tmp_path, tmp_cache):
    m = load_model(_gguf(tmp_path, qtype="F32", intermediate_size=80))
    with pytest.raises(QuantError, match=r"down_proj.*\[64, 80\].*multiple of the group size 32"):
        _engine(m, quant="int4")


def test_the_default_head_is_int4_where_the_kernel_takes_its_shape_and_int8_where_not(tmp_path, tmp_cache):
    (tmp_path / "fits").mkdir()
    (tmp_path / "odd").mkdir()
    fits = _engine(load_model(_gguf(tmp_path / "fits", qtype="F32")), quant="int4")
    # tied: its top candidates are rescored from the embedding's codes (the plan's key says so)
    assert f"{VOCAB}x{fits.config.hidden_size}:q4g32:rescored" in fits.kernel_plans
    odd = VOCAB + 8  # not a multiple of 16 output rows
    m = load_model(_gguf(tmp_path / "odd", qtype="F32", vocab_size=odd))
    assert m.config.vocab_size == odd
    eng = _engine(m, quant="int4")
    assert f"{odd}x{m.config.hidden_size}:q8g{m.config.hidden_size}:rescored" in eng.kernel_plans
    with pytest.raises(QuantError, match=rf"lm_head\.weight.*\[{odd}, {m.config.hidden_size}\].*multiple of 16"):
        _engine(m, quant="int4", head_quant="int4")


def test_native_needs_a_gguf_file(tmp_path, tmp_cache):
    with pytest.raises(LoadError, match="quant=native runs a GGUF"):
        load_model(str(tmp_path), quant="native")


def test_a_measured_plan_is_cached_and_reused(tmp_path, tmp_cache):
    m = load_model(_gguf(tmp_path), quant="native")
    opts = m.engine_options()
    assert opts.quant == "native" and opts.plan_cache.startswith(str(tmp_cache))
    first = _engine(m, quant=opts.quant, plan_cache=opts.plan_cache)
    with open(opts.plan_cache) as f:
        saved = json.load(f)
    assert saved["host"]["torch"] == torch.__version__ and saved["plans"]
    mtime = os.stat(opts.plan_cache).st_mtime_ns
    second = _engine(m, quant=opts.quant, plan_cache=opts.plan_cache)
    assert second.kernel_plans == first.kernel_plans
    assert os.stat(opts.plan_cache).st_mtime_ns == mtime  # read, not measured again


def test_a_second_head_format_adds_its_shape_to_the_cached_plan(tmp_path, tmp_cache):
    """The plan cache is per shape: loading the same model with another head format measures
    only the new head shape and keeps the decoder's entries, so alternating formats never
    re-measures (nor rewrites) the whole plan."""
    m = load_model(_gguf(tmp_path, qtype="Q8_0"), quant="native")
    opts = m.engine_options()
    first = _engine(m, head_quant="int4", quant=opts.quant, plan_cache=opts.plan_cache)
    second = _engine(m, head_quant="int8", quant=opts.quant, plan_cache=opts.plan_cache)
    with open(opts.plan_cache) as f:
        saved = json.load(f)["plans"]
    head4 = next(k for k in first.kernel_plans if ":q4g32" in k and k.startswith(f"{m.config.vocab_size}x"))
    head8 = next(k for k in second.kernel_plans if k.startswith(f"{m.config.vocab_size}x"))
    assert head4 != head8 and {head4, head8} <= set(saved)
    assert set(saved) == set(first.kernel_plans) | set(second.kernel_plans)
    mtime = os.stat(opts.plan_cache).st_mtime_ns
    third = _engine(m, head_quant="int4", quant=opts.quant, plan_cache=opts.plan_cache)
    assert third.kernel_plans == first.kernel_plans
    assert os.stat(opts.plan_cache).st_mtime_ns == mtime


def test_a_requantised_head_rescores_its_top_candidates_from_the_files_codes(tmp_path, tmp_cache):
    """Q8_0 has no exact kernel: the tied head runs on a coarser integer kernel (int4 by
    default), and its top logits are recomputed from the file's Q8_0 codes, so they equal the
    float32 engine's."""
    path = _gguf(tmp_path, qtype="Q8_0")
    ref = _engine(load_model(path))
    eng = _engine(load_model(path, quant="native"), quant="native", act_dtype=torch.float32, kernel_plan="int8")
    assert eng.model.head_exact is not None
    p = _prompts(3, 7, seed=6)
    a = ref.step([(i, x) for i, x in enumerate(p)]).logits
    b = eng.step([(i, x) for i, x in enumerate(p)]).logits
    # the true top candidates are among the coarse head's RESCORE best, so they come out exact
    # (b's own top-k may include an unrescored logit that the coarse head overstates)
    top = a.topk(4, dim=-1).indices
    assert (a.gather(1, top) - b.gather(1, top)).abs().max() < 1e-5
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (a - b).abs().max() > 1e-5  # the rest is the coarse head's own


def test_quant_options_hold_a_model_in_a_format_with_the_options_given(tmp_path, tmp_cache):
    """A loaded model's options carry its format and where its plan is cached; any other object
    with config and weights gets the format alone."""
    m = load_model(_gguf(tmp_path), quant="native")
    opts = quant_options(m, "native", block_size=4, num_blocks=64)
    assert opts == m.engine_options(block_size=4, num_blocks=64)
    assert (opts.quant, opts.block_size, opts.num_blocks) == ("native", 4, 64)
    assert opts.plan_cache.startswith(str(tmp_cache))
    assert m.engine_options("int8").plan_cache != opts.plan_cache  # one plan per format
    bare = SimpleNamespace(config=m.config, weights=m.weights)
    assert quant_options(bare, "int8", block_size=4) == EngineOptions(quant="int8", block_size=4)
