"""A quantised model's decode steps as one C call for all layers (`engine/stack.py`,
`csrc/decode_stack.c`): the same bits as the fused per-call path for logits and hidden states
on each 4-bit C kernel and on a plan that mixes them, steps with a prefill chunk falling back
to that path, a request's bits the same in any batch, and a clear error where it cannot run."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.engine.stack import segments
from tokenrouter.runtime.kernels import bindings
from tokenrouter.runtime.kernels.plan import fixed_plan
from tokenrouter.runtime.loader import load_model

HOST = bindings.int4x_problem()
pytestmark = pytest.mark.skipif(HOST is not None, reason=f"no integer int4 kernel here: {HOST}")
VOCAB = 272
DP, AMX = bindings.int4dp_problem(), bindings.int4dp_problem(amx=True)
needs_dp = pytest.mark.skipif(DP is not None, reason=f"no int4dp kernel here: {DP}")
# each kernel the stack runs, and "mixed": a plan that puts some matrices on int4avx2, some on int4dp
KERNELS = ["int4avx2", "int4avx2-x8", pytest.param("int4dp", marks=needs_dp),
           pytest.param("int4amx", marks=pytest.mark.skipif(AMX is not None, reason=f"no int4amx kernel here: {AMX}")),
           pytest.param("mixed", marks=needs_dp)]


def _model(tmp_path, family, layers=3):
    config = hf_config(family, vocab=VOCAB, layers=layers)
    path = str(tmp_path / f"{family}.gguf")
    write_gguf(path, transformers_model(config, seed=5), config, qtype="Q4_1")
    return load_model(path, quant="native")


def _engine(m, **kw):
    kw.setdefault("kernel_plan", "int4avx2")
    if kw["kernel_plan"] == "mixed":
        kw["kernel_plan"] = _mixed_plan(m)
    return Engine(m.config, m.weights, EngineOptions(block_size=4, num_blocks=64, max_model_len=128, quant="native",
                                                     attention="native", **kw))


def _mixed_plan(m, **kernels) -> dict:
    """{shape key: plan}: int4avx2 for every matrix but those named (o="int4dp", ...), as a
    measured plan may choose per shape (on an AVX-512 BF16 host, int4dp for the MLP's gate_up)."""
    e = _engine(m)
    ly = e.model.layers[0]
    plans = dict(e.kernel_plans)
    for name, plan in (kernels or {"o": "int4dp", "gate_up": "int4dp"}).items():
        plans[getattr(ly, name).key] = fixed_plan(plan) if isinstance(plan, str) else plan
    return plans


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_the_stack_gives_the_fused_paths_bits(tmp_path, family, kernel):
    """Prefills (the fused path), then decodes and short extends (the stack), with hidden states
    of the middle layer wanted (the stack cut there): logits and hidden states equal bit for bit."""
    m = _model(tmp_path, family)
    stacked, calls = _engine(m, kernel_plan=kernel), _engine(m, kernel_plan=kernel, decode_stack=False)
    assert stacked.model.stacked and not calls.model.stacked and calls.model.fused
    ly = stacked.model.layers[0]
    ran = [lin.plan[0][1] for lin in (ly.qkv, ly.o, ly.gate_up, ly.down)]
    assert ran == (["int4avx2", "int4dp", "int4dp", "int4avx2"] if kernel == "mixed" else [kernel] * 4)
    needs = FeatureNeeds(hidden_layers=(0, 2, -1))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (9, 3, 30)]
    batch = [(i, p) for i, p in enumerate(prompts)]
    for step in range(6):
        a, b = stacked.step(batch, needs), calls.step(batch, needs)
        assert torch.equal(a.logits, b.logits), step
        for k in needs.hidden_layers:
            assert torch.equal(a.hidden[k], b.hidden[k]), (step, k)
        nxt = b.logits.argmax(-1).tolist()
        batch = [(i, [t] * (1 + (step + i) % 3)) for i, t in enumerate(nxt)]  # decodes and short extends
    assert stacked.model.stack_steps == 5 and calls.model.stack_steps == 0  # the stack ran, but not the prefill


def test_a_step_over_the_kept_buffers_rows_allocates_its_own_and_gives_the_same_bits(tmp_path):
    m = _model(tmp_path, "llama", layers=2)
    stacked, calls = _engine(m), _engine(m, decode_stack=False)
    g = torch.Generator().manual_seed(3)
    for step in range(2):  # 5 requests x 16-token extends: 80 rows, over the 64 kept
        batch = [(i, torch.randint(0, VOCAB, (16,), generator=g).tolist()) for i in range(5)]
        if step == 0:
            batch = [(i, t[:3]) for i, t in batch]  # a short first visit: the next step is all extends
        assert torch.equal(stacked.step(batch).logits, calls.step(batch).logits)
    assert stacked.model.stack_steps == 2


@pytest.mark.parametrize("kernel", ["int4avx2", pytest.param("mixed", marks=needs_dp)])
def test_the_stack_gives_a_request_the_same_bits_in_any_batch(tmp_path, kernel):
    m = _model(tmp_path, "qwen3")
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, VOCAB, (30,), generator=g).tolist() for _ in range(4)]
    steps = {0: (10, 2), 1: (9, 1), 2: (5, 3), 3: (17, 1)}
    batched = _engine(m, kernel_plan=kernel)
    assert batched.model.stacked
    for s, (have, _) in steps.items():
        batched.step([(s, seqs[s][:have])])
    out = batched.step([(s, seqs[s][have:have + k]) for s, (have, k) in steps.items()]).logits
    for i, (s, (have, k)) in enumerate(steps.items()):
        alone = _engine(m, kernel_plan=kernel)
        alone.step([(s, seqs[s][:have])])
        assert torch.equal(out[i], alone.step([(s, seqs[s][have:have + k])]).logits[0]), f"request {s}"


def test_the_stack_on_demand_says_why_it_cannot_run(tmp_path):
    m = _model(tmp_path, "llama", layers=2)
    with pytest.raises(ValueError, match="decode_stack=True: its matrices run int4, not a C int4 kernel"):
        _engine(m, kernel_plan="int4", decode_stack=True)
    # the stack runs one kernel a matrix; a plan that switches with the row count is the fused path's
    switching = _mixed_plan(m, gate_up=[(8, "int4avx2"), (64, "int4avx2-x8")])
    with pytest.raises(ValueError, match=r"decode_stack=True: matrices 192x64:q4g32 change kernel with the row count"):
        _engine(m, kernel_plan=switching, decode_stack=True)
    with pytest.raises(ValueError, match="decode_stack=True: decode attention runs on torch's path"):
        Engine(m.config, m.weights, EngineOptions(block_size=4, num_blocks=64, max_model_len=128, quant="native",
                                                  kernel_plan="int4avx2", attention="torch", decode_stack=True))
    with pytest.raises(ValueError, match="decode_stack=True: the fused C element-wise path does not run"):
        _engine(m, fused_ops=False, decode_stack=True)
    assert not _engine(m, kernel_plan="int4").model.stacked


def test_segments_cut_after_each_wanted_layer():
    assert segments(4, set()) == [(0, 4)]
    assert segments(4, {0, 2, 4, -1}) == [(0, 2), (2, 4)]
    assert segments(3, {1, 2}) == [(0, 1), (1, 2), (2, 3)]
