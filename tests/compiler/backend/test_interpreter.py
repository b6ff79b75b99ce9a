"""The reference interpreter on cases worked out by hand (it is the oracle: anchor it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep

INF = math.inf


def _prog(when, *, bound=None, dest="llm", action="rewrite", **kw):
    return ir.Program(source="t.route", language_version=1, models=(ir.Model("slm", "a"), ir.Model("llm", "b")),
                      start="slm", transitions=(ir.Transition("slm", dest, when, action),),
                      bounds=(bound,) if bound else (), **kw)


def _route(program, logits, visit=1, **kw):
    return Interpreter(program).route("slm", RequestStep(logits=np.array(logits, dtype=np.float64),
                                                         visit_tokens=visit, **kw))


def _cmp(feature, op, value):
    return ir.Compare(op, feature, ir.Const(value))


def test_entropy_top_prob_and_margin_by_hand():
    probs = [0.5, 0.3, 0.2]
    logits = [math.log(p) + 1.7 for p in probs]  # a shift changes nothing
    h = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))  # 1.0296530 nats
    for feature, value in [(ir.Entropy("slm", False), h), (ir.Entropy("slm", True), h / math.log(3)),
                           (ir.TopProb("slm"), 0.5), (ir.Margin("slm"), 0.2)]:
        assert _route(_prog(_cmp(feature, ">", value - 1e-9)), logits).dest == "llm"
        assert _route(_prog(_cmp(feature, ">", value + 1e-9)), logits).dest == "slm"


def test_uniform_and_one_hot():
    uniform, onehot = [0.0] * 8, [2.0] + [-INF] * 7
    ent = ir.Entropy("slm", True)
    assert _route(_prog(_cmp(ent, ">", 0.999999)), uniform).dest == "llm"
    assert _route(_prog(_cmp(ent, "<=", 0.0)), onehot).dest == "llm"  # exactly 0: -inf terms count 0
    assert _route(_prog(_cmp(ir.Margin("slm"), "==", 1.0)), onehot).dest == "llm"
    assert _route(_prog(_cmp(ir.Margin("slm"), "==", 0.0)), uniform).dest == "llm"


@pytest.mark.parametrize("row", [[1.0, math.nan, 0.0], [1.0, INF, 0.0], [-INF, -INF, -INF]])
def test_invalid_rows_have_nan_features(row):
    ent = ir.Entropy("slm", False)
    for op in ("<", "<=", ">", ">=", "=="):
        assert _route(_prog(_cmp(ent, op, 0.5)), row).dest == "slm"  # NaN compares false: stays
    assert _route(_prog(_cmp(ent, "!=", 0.5)), row).dest == "llm"  # ... except !=
    assert _route(_prog(ir.Logic("not", (_cmp(ent, ">", 0.5),))), row).dest == "llm"
    assert _route(_prog(ent), row).dest == "slm"  # a NaN number is false


def test_actions_and_bounds():
    always = _cmp(ir.VisitTokens(), ">=", 0)
    d = _route(_prog(always), [0.0, 0.0])
    assert (d.dest, d.keep, d.reason) == ("llm", False, "transition 0")
    d = _route(_prog(always, action="keep"), [0.0, 0.0])
    assert (d.dest, d.keep) == ("llm", True)
    d = _route(_prog(always, dest="slm"), [0.0, 0.0])  # a move to itself keeps
    assert (d.dest, d.keep) == ("slm", True)
    bound = ir.VisitBound("slm", min_tokens=3, max_tokens=5, then="llm")
    assert _route(_prog(always, bound=bound), [0.0, 0.0], visit=2).reason == "min"
    assert _route(_prog(always, bound=bound), [0.0, 0.0], visit=3).reason == "transition 0"
    d = _route(_prog(_cmp(ir.VisitTokens(), "<", 0), bound=bound), [0.0, 0.0], visit=5)
    assert (d.dest, d.keep, d.reason) == ("llm", True, "max")
    d = _route(_prog(always, bound=bound), [0.0, 0.0], visit=9)  # the max wins over a rewrite
    assert (d.dest, d.keep, d.reason) == ("llm", True, "max")


def test_arithmetic_is_ieee():
    one_over_zero = ir.Arith("/", ir.Const(1.0), ir.Arith("-", ir.VisitTokens(), ir.VisitTokens()))
    assert _route(_prog(_cmp(one_over_zero, ">", 1e308)), [0.0, 0.0]).dest == "llm"  # +inf
    zero_over_zero = ir.Arith("/", ir.Const(0.0), ir.Const(0.0))
    assert _route(_prog(_cmp(zero_over_zero, "!=", 0.0)), [0.0, 0.0]).dest == "llm"  # NaN


def test_bernoulli_uses_the_ir_hash():
    coin = ir.Bernoulli(0.3, 11)
    for pos in range(50):
        d = _route(_prog(coin), [0.0, 0.0], position=pos, request_seed=-5)
        assert (d.dest == "llm") == (ir.bernoulli_uniform(11, -5, pos) < 0.3)


def test_router_network_by_hand(tmp_path):
    """One linear layer w = [1, -1, 0.5], b = 0.25 on hidden [2, 1] and top-1 logit 4:
    sigmoid(2 - 1 + 2 + 0.25) = sigmoid(3.25)."""
    save_file({"layers.0.weight": torch.tensor([[1.0, -1.0, 0.5]]), "layers.0.bias": torch.tensor([0.25])},
              str(tmp_path / "r.safetensors"))
    net = ir.RouterNet("r", "slm", "r.safetensors", inputs=(ir.InputHidden(-1, 2), ir.InputTopkLogits(1)))
    p = 1 / (1 + math.exp(-3.25))
    interp = lambda when: Interpreter(_prog(when, routers=(net,)), base_dir=str(tmp_path))  # noqa: E731
    step = RequestStep(logits=np.array([4.0, 0.0]), hidden={-1: np.array([2.0, 1.0])})
    assert interp(_cmp(ir.RouterProb("r"), ">", p - 1e-12)).route("slm", step).dest == "llm"
    assert interp(_cmp(ir.RouterProb("r"), ">", p + 1e-12)).route("slm", step).dest == "slm"


def test_head_row_by_hand(tmp_path):
    save_file({"weight": torch.tensor([0.5, -2.0]), "bias": torch.tensor([1.0])}, str(tmp_path / "h.safetensors"))
    z = 0.5 * 3 - 2.0 * 1 + 1.0  # 0.5
    for sigmoid, value in [(False, z), (True, 1 / (1 + math.exp(-z)))]:
        head = ir.HeadLogit("slm", "h.safetensors", sigmoid)
        it = Interpreter(_prog(_cmp(head, ">=", value)), base_dir=str(tmp_path))
        step = RequestStep(logits=np.array([0.0, 0.0]), hidden={-1: np.array([3.0, 1.0])})
        assert it.route("slm", step).dest == "llm"
        it = Interpreter(_prog(_cmp(head, ">", value)), base_dir=str(tmp_path))
        assert it.route("slm", step).dest == "slm"


def test_average_ensemble_by_hand():
    program = ir.Program(source="t", language_version=1, models=(ir.Model("a", "x"), ir.Model("b", "y")),
                         start="e", ensembles=(ir.Ensemble("e", ("a", "b"), (1.0, 3.0)),))
    step = RequestStep(member_logits=(np.array([0.0, 0.0, -INF]), np.array([0.0, -INF, -INF])))
    out = Interpreter(program).combine("e", step)
    np.testing.assert_allclose(np.exp(out), [0.875, 0.125, 0.0], atol=1e-15)
    assert out[2] == -INF
