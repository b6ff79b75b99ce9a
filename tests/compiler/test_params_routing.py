"""`--set` moves a rule's threshold: the routing decisions change exactly as the entropy
worked out by hand predicts, the generated module agrees with the reference interpreter
at every setting, and the default makes the same decisions as the number it replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.compiler.conftest import REPO
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.compiler.pipeline import check_file, check_source
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep
from tokenrouter.runtime.loader import model_facts

RSTITCH = REPO / "examples" / "rstitch.route"
V = 32


def _rows(n: int, seed: int = 0) -> np.ndarray:
    """Logit rows whose normalized entropies spread over (0, 1): random logits at random
    temperatures."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.uniform(-3.0, 3.0, size=(n, 1)))
    return (rng.standard_normal((n, V)) * scale).astype(np.float32).astype(np.float64)


def _entropy(row: np.ndarray) -> float:
    p = np.exp(row - row.max())
    p /= p.sum()
    return float(-(p * np.log(np.where(p > 0, p, 1.0))).sum() / math.log(V))


def _decisions(program, rows: np.ndarray, writer: str):
    interp = Interpreter(program)
    return [(d.dest, d.keep) for d in (interp.route(writer, RequestStep(logits=r)) for r in rows)]


def _generated(program, rows: np.ndarray, writer: str):
    from tokenrouter.protocol.step import StepTensors

    routers = load_routers(program, dtype=torch.float64)
    b = len(rows)
    step = StepTensors(logits=torch.from_numpy(rows), sampled=torch.zeros(b, dtype=torch.int64),
                       visit_tokens=torch.ones(b, dtype=torch.int64), position=torch.arange(b),
                       request_seed=torch.zeros(b, dtype=torch.int64))
    out = routers[writer].route(step)
    writers = program.writers()
    return [(writers[int(out[0, i])], bool(out[1, i])) for i in range(b)]


@pytest.mark.parametrize("tau", [None, "0.3", "0.55", "0.8"])
def test_set_tau_moves_rstitch_decisions(tau):
    rows = _rows(400)
    h = np.array([_entropy(r) for r in rows])
    program, diags = check_file(RSTITCH, params={"tau": tau} if tau else None, model_facts=model_facts)
    assert diags == []
    t = float(tau) if tau else 0.02
    assert program.param("tau").value == t
    far = np.abs(h - t) > 1e-9  # leave exact ties to the differential tests
    up = _decisions(program, rows, "slm")
    back = _decisions(program, rows, "llm")
    for i in np.flatnonzero(far):
        assert up[i] == (("llm", False) if h[i] > t else ("slm", True)), (i, h[i], t)
        assert back[i] == (("slm", True) if h[i] <= t else ("llm", True)), (i, h[i], t)
    assert _generated(program, rows, "slm") == up and _generated(program, rows, "llm") == back
    assert 20 < sum(d[0] == "llm" for d in up) < 380  # the setting splits this workload


def test_settings_change_decisions_and_the_default_changes_nothing():
    rows = _rows(400, seed=1)
    by_tau = {tau: _decisions(check_file(RSTITCH, params={"tau": tau}, model_facts=model_facts)[0], rows, "slm") for tau in ("0.3", "0.8")}
    assert by_tau["0.3"] != by_tau["0.8"]
    default, _ = check_file(RSTITCH, model_facts=model_facts)
    text = RSTITCH.read_text().replace("> tau rewrite", "> 0.02 rewrite").replace("<= tau keep", "<= 0.02 keep")
    literal, diags = check_source(text, str(RSTITCH), model_facts=model_facts)  # the program as it was before it had a parameter
    assert [d.code for d in diags] == ["W002"]  # tau is now unused
    assert _decisions(default, rows, "slm") == _decisions(literal, rows, "slm")
    assert _decisions(default, rows, "llm") == _decisions(literal, rows, "llm")
    from tokenrouter.compiler.backend.codegen import generate_module
    assert generate_module(default) == generate_module(literal)  # the same generated code
