"""`Reference.generate` records how close each output position's routing came to a tie
(`ReferenceOutput.route_gaps`), which differential tests use to tell a rounding-decided
threshold tie from a real departure."""

import math

from tests.helpers import tiny
from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.interpreter import RequestStep
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.reference import Reference

PROMPT = [5, 9, 14, 3, 22, 7]
PARAMS = SamplingParams(max_tokens=6, stop_token_ids=(tiny.EOS,))


def first_entropy(pair) -> float:
    """The small model's normalized entropy at the prompt's first step (the interpreter's)."""
    ref = Reference(tiny.rstitch(pair, 0.5))
    logits, _ = ref.engines["slm"].forward(PROMPT, FeatureNeeds())
    return float(ref.interp.value("slm", RequestStep(logits=logits.double().numpy()), ir.Entropy("slm", True)))


def test_each_position_records_its_closest_routing_tie(pair):
    h0 = first_entropy(pair)
    # tau 0.1 above the first step's entropy: the small model keeps its token, 0.1 from the tie
    out = Reference(tiny.rstitch(pair, h0 + 0.1)).generate(PROMPT, PARAMS)
    assert len(out.route_gaps) == len(out.tokens) and out.writers[0] == "slm"
    assert math.isclose(out.route_gaps[0], 0.1, abs_tol=1e-9)
    assert all(0 <= g < math.inf for g in out.route_gaps)  # every position compared an entropy with tau
    # tau just below it: the small model hands the position to the large one, 1e-6 from the tie
    out = Reference(tiny.rstitch(pair, h0 - 1e-6)).generate(PROMPT, PARAMS)
    assert out.writers[0] == "llm" and out.route_gaps[0] <= 1e-6 + 1e-12


def test_a_rule_without_features_has_no_tie(pair):
    out = Reference(tiny.coin(pair, 0.5)).generate(PROMPT, PARAMS)
    assert len(out.route_gaps) == len(out.tokens) and all(g == math.inf for g in out.route_gaps)
