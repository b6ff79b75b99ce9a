"""GGUF files that mix block types, as Qwen's official Q4_K_M files do, run as they are
(`quant = native`): tiny random models written with each mix.

- "qwen-0.5b": Qwen2.5-Coder-0.5B's mix: Q5_0 for the embedding and most matrices, Q8_0 for
  the untied head and every other layer's v, Q4_K and Q6_K alternating for down;
- "qwen-1.5b": Qwen2.5-Coder-1.5B's: Q4_K for the embedding and most matrices, Q6_K for the
  untied head and every other layer's v and down (so q/k/v fuse from two formats).

With float32 activations every matrix without a float32-exact integer kernel runs a float
kernel on its exact values, and the model equals the dequantised float engine; with
bfloat16 activations the integer kernels run (int4avx2, int8avx2, parts of both in one
fused matrix), the decode stack gives the per-call path's bits, and a request's logits are
the same in any batch."""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers.checkpoints import hf_config, largest_logit_gap, transformers_model, write_gguf
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels.bindings import int4x_problem
from tokenrouter.runtime.kernels.blocks import BlockRows
from tokenrouter.runtime.kernels.linear import PlannedParts
from tokenrouter.runtime.loader import load_model

VOCAB = 272
SHAPES = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "num_hidden_layers": 4}


def _layer(gname: str) -> int:
    return int(gname.split(".")[1]) if gname.startswith("blk.") else -1


def qwen_05b(gname: str) -> str:
    if gname == "output.weight":
        return "Q8_0"
    if gname.endswith("attn_v.weight"):
        return "Q8_0" if _layer(gname) % 2 == 0 else "Q5_0"
    if gname.endswith("ffn_down.weight"):
        return "Q6_K" if _layer(gname) % 2 == 0 else "Q4_K"
    return "Q5_0"


def qwen_15b(gname: str) -> str:
    if gname == "output.weight" or (gname.endswith(("attn_v.weight", "ffn_down.weight")) and _layer(gname) % 2 == 0):
        return "Q6_K"
    return "Q4_K"


MIXES = {"qwen-0.5b": qwen_05b, "qwen-1.5b": qwen_15b}
HOST = int4x_problem()
needs_c = pytest.mark.skipif(HOST is not None, reason=f"no integer kernels here: {HOST}")


@pytest.fixture(scope="module")
def mixes(tmp_path_factory):
    """mix name -> the GGUF file of a tiny untied Qwen2 model written with that mix."""
    out = {}
    for name, mix in MIXES.items():
        config = {**hf_config("qwen2", vocab=VOCAB, tie=False), **SHAPES}
        path = str(tmp_path_factory.mktemp(name) / f"{name}.gguf")
        write_gguf(path, transformers_model(config, seed=3), config, qtype=mix)
        out[name] = path
    return out


def _engine(m, **kw):
    return Engine(m.config, m.weights, EngineOptions(block_size=4, num_blocks=96, max_model_len=128, **kw))


def _prompts(n, length, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("mix", list(MIXES))
def test_with_float32_activations_a_mix_equals_the_dequantised_engine(mixes, tmp_cache, mix):
    """The codes are the file's values exactly: head in its own codes (`head_quant="native"`),
    the whole model within float rounding of the gguf package's float32 dequantisation."""
    ref = _engine(load_model(mixes[mix]))
    native = load_model(mixes[mix], quant="native")
    assert isinstance(native.weights["lm_head.weight"], BlockRows)
    eng = _engine(native, quant="native", act_dtype=torch.float32, head_quant="native", kernel_plan="int4")
    assert largest_logit_gap(ref, eng, _prompts(3, 11), 3) < 1e-5


@pytest.mark.parametrize("mix", list(MIXES))
def test_a_requantised_head_rescores_its_best_candidates_from_the_files_blocks(mixes, tmp_cache, mix):
    """The default head of a Q8_0 or Q6_K output matrix is int4; its 16 best logits a row are
    recomputed from the file's own rows (read in place), so they are the float engine's."""
    ref = _engine(load_model(mixes[mix]))
    eng = _engine(load_model(mixes[mix], quant="native"), quant="native", act_dtype=torch.float32, kernel_plan="int4")
    assert isinstance(eng.model.head_exact, BlockRows) and eng.model.lm_head.key.endswith(":q4g32:rescored")
    p = _prompts(4, 9, seed=2)
    a = ref.step([(i, x) for i, x in enumerate(p)]).logits
    b = eng.step([(i, x) for i, x in enumerate(p)]).logits
    top = a.topk(4, dim=-1).indices
    assert (a.gather(1, top) - b.gather(1, top)).abs().max() < 1e-5
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert (a - b).abs().max() > 1e-5  # the rest is the int4 head's own


@needs_c
@pytest.mark.parametrize("mix", list(MIXES))
def test_on_the_integer_kernels_the_stack_gives_the_per_call_bits(mixes, tmp_cache, mix):
    """bfloat16 activations: q8 matrices on int8avx2, q4 on int4avx2, a fused matrix of both
    as parts; decodes as one stack call equal the per-call path bit for bit."""
    m = load_model(mixes[mix], quant="native")
    stacked = _engine(m, quant="native", kernel_plan="int4avx2", attention="native")
    calls = _engine(m, quant="native", kernel_plan="int4avx2", attention="native", decode_stack=False)
    assert stacked.model.stacked and calls.model.fused and not calls.model.stacked
    kernels = {k for plan in stacked.kernel_plans.values() for _, k in plan}
    assert kernels == {"int4avx2", "int8avx2"}
    qkv0 = stacked.model.layers[0].qkv
    if mix == "qwen-1.5b":  # Q4_K q and k, Q6_K v: two parts
        assert isinstance(qkv0, PlannedParts) and [p.plan[0][1] for p in qkv0.parts] == ["int4avx2", "int8avx2"]
    else:  # Q5_0 q and k with a Q8_0 v: one q8 matrix
        assert qkv0.key == "512x256:q8g32"
    batch = [(i, p) for i, p in enumerate(_prompts(3, 10, seed=4))]
    for step in range(5):
        a, b = stacked.step(batch), calls.step(batch)
        assert torch.equal(a.logits, b.logits), step
        batch = [(i, [t] * (1 + (step + i) % 2)) for i, t in enumerate(b.logits.argmax(-1).tolist())]
    assert stacked.model.stack_steps >= 4 and calls.model.stack_steps == 0


@needs_c
@pytest.mark.parametrize("mix", list(MIXES))
def test_a_request_gets_the_same_logits_in_any_batch(mixes, tmp_cache, mix):
    """Measured plan, bfloat16 activations: prefill, decodes and short extends at different
    lengths in one step give each request its logits alone, bit for bit."""
    m = load_model(mixes[mix], quant="native")
    seqs = _prompts(4, 40, seed=3)
    steps = {0: (0, 13), 1: (10, 1), 2: (7, 3), 3: (20, 1)}
    batched = _engine(m, quant="native")
    for s, (have, _) in steps.items():
        if have:
            batched.step([(s, seqs[s][:have])])
    out = batched.step([(s, seqs[s][have:have + k]) for s, (have, k) in steps.items()]).logits
    for i, (s, (have, k)) in enumerate(steps.items()):
        alone = _engine(m, quant="native", kernel_plan=batched.kernel_plans)
        if have:
            alone.step([(s, seqs[s][:have])])
        assert torch.equal(out[i], alone.step([(s, seqs[s][have:have + k])]).logits[0]), s


@needs_c
@pytest.mark.parametrize("mix", list(MIXES))
def test_on_the_integer_kernels_greedy_tokens_follow_the_float_engine(mixes, tmp_cache, mix):
    """The ~15-bit activations and the int4 head with its rescoring: on random tiny models
    (flat distributions, where any rounding flips near-ties) most teacher-forced greedy
    tokens agree with the float engine, and the logits stay close."""
    path = mixes[mix]
    ref, eng = _engine(load_model(path)), _engine(load_model(path, quant="native"), quant="native",
                                                  kernel_plan="int4avx2")
    p = _prompts(4, 24, seed=5)
    a = ref.step([(i, x) for i, x in enumerate(p)]).logits
    b = eng.step([(i, x) for i, x in enumerate(p)]).logits
    agree, total = int((a.argmax(-1) == b.argmax(-1)).sum()), 4
    for _ in range(8):
        nxt = a.argmax(-1).tolist()
        a = ref.step([(i, [t]) for i, t in enumerate(nxt)]).logits
        b = eng.step([(i, [t]) for i, t in enumerate(nxt)]).logits
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += 4
        top = a.topk(1, dim=-1).indices
        assert (a.gather(1, top) - b.gather(1, top)).abs().max() < 0.05 * a.abs().max()
    assert agree >= 0.8 * total, f"{agree} of {total}"
