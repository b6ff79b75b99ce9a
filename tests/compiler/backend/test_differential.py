"""Generated `route`/`combine` against the reference interpreter. (The handoff has one
implementation, `protocol/handoff.py`, which every generated router delegates to; its
invariants are tested in `tests/protocol/test_handoff.py`.)

Threshold ties: the main test runs the generated code in float64, the interpreter's dtype,
on float32-valued inputs (converted exactly), so the two differ only in summation order
(~1e-16). A disagreement is tolerated only on a row where the interpreter reports a
comparison within 1e-9 (relative) of its threshold, and the test asserts such rows are
rare; every other row must agree. The float32 test (the serving dtype) tolerates
disagreements within 1e-4 of a threshold. Hypothesis is derandomised.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.compiler.conftest import (EXAMPLES, PROGRAMS, ROW_KINDS, SETTINGS, check_coverage, check_route_batch,
                                    get_program, make_batch, write_random_weights)
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.compiler.backend.interpreter import Interpreter

# Every example file gets the full 1,000 batches; the hand-built programs (which also cover
# operators the examples do not use) get fewer, to stay within the time budget.
EXAMPLE_KEYS = [f"example:{n}" for n in EXAMPLES]
ALL_KEYS = EXAMPLE_KEYS + sorted(PROGRAMS)
N_BATCHES = {**{k: 1000 for k in EXAMPLE_KEYS}, **{k: 250 for k in PROGRAMS}}

_kinds = st.one_of(st.just(ROW_KINDS), st.lists(st.sampled_from(ROW_KINDS), min_size=1, max_size=3).map(tuple))


def _setup(program, tmp_path, dtype):
    write_random_weights(program, tmp_path)
    return Interpreter(program, base_dir=str(tmp_path)), load_routers(program, dtype=dtype, base_dir=str(tmp_path))


def random_batches(name, tmp_path, dtype: torch.dtype, tie_gap: float, batches: int):
    """Program `name`'s generated routers in `dtype` against the interpreter on `batches`
    random batches (`check_route_batch`, which tolerates a disagreement within `tie_gap` of a
    threshold): (program, the rows' kinds seen, rows at a tie, rows)."""
    program = get_program(name, tmp_path)
    interp, routers = _setup(program, tmp_path, dtype)
    writers = program.writers()
    seen: Counter = Counter()
    total = [0, 0]

    @settings(max_examples=batches, **SETTINGS)
    @given(w=st.integers(0, len(writers) - 1), b=st.integers(1, 64), seed=st.integers(0, 2**32 - 1), kinds=_kinds)
    def run(w, b, seed, kinds):
        writer = writers[w]
        step, rows = make_batch(program, writer, routers[writer].needs, np.random.default_rng(seed), b, kinds)
        total[0] += check_route_batch(program, interp, routers, writer, step, rows, dtype, tie_gap, seen)
        total[1] += b

    run()
    return program, seen, total[0], total[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_KEYS)
def test_route_matches_interpreter_float64(name, tmp_path):
    program, seen, ties, rows = random_batches(name, tmp_path, torch.float64, 1e-9, N_BATCHES[name])
    assert ties <= 0.001 * rows, f"{ties} of {rows} rows at a threshold tie"
    check_coverage(program, seen)


@pytest.mark.parametrize("name", ALL_KEYS)
def test_route_matches_interpreter_float32(name, tmp_path):
    random_batches(name, tmp_path, torch.float32, 1e-4, 100)
