"""SmolLM2-135M in the quantised formats (bfloat16 activations) against the float32 engine on
the same file, 8 prompts x 101 teacher-forced positions (808).

Measured on an Intel Xeon, 2 threads, default int4 LM head (its top 16 candidates rescored
from the file's codes), C element-wise path (`fused_ops`) / torch's:
- native and int4: 98.9% (799/808) / 98.5% (796/808), max |dlogit| 5.7 (far from the top;
  int4 requantises this file's Q4_1 values onto the same grid); over the first 41 positions
  both are 99.1% (325/328), the issue's 99%. The misses are bfloat16 rounding of the int4
  kernel's inputs and outputs, not the format: with float32 activations the same weights
  agree at 808/808, and a float32 head gives the same 98.9% / 98.5%.
- int8 (one scale per output row): 96.8%: a row with an outlier weight gets a coarse step
  for all its others, which group-wise formats avoid.
- native on the C int4 kernel (`int4dp`, AVX-512 BF16 hosts): 99.9% (807/808), 100% over the
  first 41 positions: it keeps the file's float16 scales and a float32 output, so only x is
  rounded to bfloat16.
The thresholds sit a few positions under those figures, so rounding noise does not fail the
test but a wrong kernel or layout (which costs tens of points) does."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels import bindings, build
from tokenrouter.runtime.loader import load_model

pytestmark = pytest.mark.real_weights

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,", "The three primary colours are",
           "To make a cup of tea, first", "The largest planet in the solar system", "In 1969, astronauts"]
STEPS = 100


def _run(eng, prompts, forced=None):
    """Logits at every decode position, feeding `forced` tokens (teacher forcing) or greedy ones."""
    out = eng.step([(i, p) for i, p in enumerate(prompts)]).logits
    logits, toks = [out], []
    for s in range(STEPS):
        nxt = out.argmax(-1).tolist() if forced is None else forced[s]
        toks.append(nxt)
        out = eng.step([(i, [t]) for i, t in enumerate(nxt)]).logits
        logits.append(out)
    return torch.stack(logits), toks


# Both engines on one attention path: the float32 reference's and the quantised engine's
# roundings then differ only by the format (over the first 41 positions, measured on an Intel
# Xeon: 325/328 with both on the C kernel, 324/328 with both on torch's path).
ATTENTION = "native" if build.available() is None else "torch"


@pytest.fixture(scope="module")
def reference():
    m = load_model("smollm2-135m")
    prompts = [m.tokenizer.encode(p) for p in PROMPTS]
    eng = Engine(m.config, m.weights, EngineOptions(num_blocks=80, max_model_len=160, attention=ATTENTION))
    logits, toks = _run(eng, prompts)
    return m, prompts, logits, toks


# (format, kernel, least agreement): torch's int4 kernel rounds its scales, zeros and output to
# bfloat16; the C kernel (`int4dp` where the CPU has AVX-512 BF16, `int4amx` where it has AMX
# tiles) rounds only x, and agrees at 807/808 (99.9%) on an Intel Xeon
CASES = [("native", "int4", "float32", 0.98), ("int4", "int4", "float32", 0.98), ("int8", "int8", "float32", 0.96),
         ("native", "int4dp", "float32", 0.99), ("native", "int4amx", "float32", 0.99),
         ("native", "int4avx2", "float32", 0.99), ("native", "int4avx2-x8", "float32", 0.96),
         ("native", "int4avx2", "float16", 0.99), ("native", "int4avx2", "bfloat16", 0.99),
         ("native", "int4", "float16", 0.98)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("quant,kernel,kv,least", CASES)
def test_quantised_formats_agree_with_float32_on_greedy_tokens(reference, quant, kernel, kv, least, capsys):
    """`kernel_plan` puts every matrix on the named integer kernel, `kv` is the cache's element type."""
    why = bindings.int4dp_problem(amx=kernel == "int4amx") if kernel in ("int4dp", "int4amx") else \
        bindings.int4x_problem() if kernel.startswith("int4avx2") else None
    if why:
        pytest.skip(why)
    m, prompts, ref, toks = reference
    src = load_model("smollm2-135m", quant="native") if quant == "native" else m
    eng = Engine(src.config, src.weights, EngineOptions(num_blocks=80, max_model_len=160, quant=quant,
                                                         kernel_plan=kernel, attention=ATTENTION, kv_dtype=kv))
    assert {k for lin in eng.model.decoder_linears() for _, k in lin.plan} == {kernel}  # the head: its own format
    got, _ = _run(eng, prompts, forced=toks)
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    dmax = (got - ref).abs().max().item()
    with capsys.disabled():
        print(f"\n[quant={quant}, {kernel}, {kv} KV] greedy agreement {100 * agree:.1f}% of {ref.shape[0] * ref.shape[1]} "
              f"teacher-forced positions, max |dlogit| {dmax:.3f}")
    assert agree >= least
