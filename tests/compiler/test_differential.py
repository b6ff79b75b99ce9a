"""Generated `route`/`combine`/`send`/`receive` against the reference interpreter.

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


@pytest.mark.parametrize("name", ALL_KEYS)
def test_route_matches_interpreter_float64(name, tmp_path):
    program = get_program(name, tmp_path)
    interp, routers = _setup(program, tmp_path, torch.float64)
    writers = program.writers()
    seen: Counter = Counter()
    total = [0, 0]

    @settings(max_examples=N_BATCHES[name], **SETTINGS)
    @given(w=st.integers(0, len(writers) - 1), b=st.integers(1, 64), seed=st.integers(0, 2**32 - 1), kinds=_kinds)
    def run(w, b, seed, kinds):
        writer = writers[w]
        step, rows = make_batch(program, writer, routers[writer].needs, np.random.default_rng(seed), b, kinds)
        total[0] += check_route_batch(program, interp, routers, writer, step, rows, torch.float64, 1e-9, seen)
        total[1] += b

    run()
    assert total[0] <= 0.001 * total[1], f"{total[0]} of {total[1]} rows at a threshold tie"
    check_coverage(program, seen)


@pytest.mark.parametrize("name", ALL_KEYS)
def test_route_matches_interpreter_float32(name, tmp_path):
    program = get_program(name, tmp_path)
    interp, routers = _setup(program, tmp_path, torch.float32)
    writers = program.writers()
    seen: Counter = Counter()

    @settings(max_examples=100, **SETTINGS)
    @given(w=st.integers(0, len(writers) - 1), b=st.integers(1, 64), seed=st.integers(0, 2**32 - 1), kinds=_kinds)
    def run(w, b, seed, kinds):
        writer = writers[w]
        step, rows = make_batch(program, writer, routers[writer].needs, np.random.default_rng(seed), b, kinds)
        check_route_batch(program, interp, routers, writer, step, rows, torch.float32, 1e-4, seen)

    run()


# ------------------------------------------------------------------ send / receive


def _scenario(rng, writers, models):
    """One random handoff: a state to send from, and a message for a receiver that knows a
    prefix of the tokens (all lined up, an overlap, a gap, or a disagreeing token)."""
    from tokenrouter.protocol.state import PeerMessage, RouteState
    n = int(rng.integers(1, 40))
    full = rng.integers(0, 50_000, n + int(rng.integers(0, 20))).tolist()
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    sender, peer, writer = pick(writers), pick(list(writers) + ["nobody"]), pick(writers)
    prompt_len, seed = int(rng.integers(0, n + 1)), int(rng.integers(-(2**63), 2**63 - 1))

    def state(tokens, read):
        return RouteState(rid="r1", tokens=list(tokens), prompt_len=prompt_len, writer=writer,
                          visit_tokens=3, route_seed=seed, peer_read=dict(read),
                          written_by={"x": 3}, sampling={"temperature": 0.0})

    read = {peer: int(rng.integers(0, n + 3))}
    known, start = int(rng.integers(0, len(full) + 1)), int(rng.integers(0, len(full) + 1))
    suffix = full[start:]
    if suffix and rng.random() < 0.25:
        suffix[0] += 1
    msg = PeerMessage(rid="r1" if rng.random() < 0.97 else "r2", suffix=suffix, start=start,
                      prompt_len=prompt_len if rng.random() < 0.97 else prompt_len + 1,
                      writer=pick(writers) if rng.random() < 0.97 else "nobody", visit_tokens=1,
                      route_seed=seed, sender=sender, written_by={sender: 2})
    fresh = rng.random() < 0.3
    return (sender, peer, lambda: state(full[:n], read), msg,
            lambda: None if fresh else state(full[:known], {}), pick(writers))


def _outcome(fn):
    try:
        return fn()
    except ValueError as exc:  # the same refusal, for the same reason
        return ("error", str(exc))


@pytest.mark.parametrize("name", EXAMPLE_KEYS + ["ensemble", "kitchen"])
def test_send_receive_match_interpreter(name, tmp_path):
    """Random states and messages, 4 per example: same message, state and refusals."""
    program = get_program(name, tmp_path)
    interp, routers = _setup(program, tmp_path, torch.float32)
    writers, models = program.writers(), [m.name for m in program.models]
    seen = Counter()

    @settings(max_examples=1000, **SETTINGS)
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed):
        rng = np.random.default_rng(seed)
        for _ in range(4):
            sender, peer, make_state, msg, make_known, receiver = _scenario(rng, writers, models)
            a, b = make_state(), make_state()
            m1 = _outcome(lambda: routers[sender].send(a, peer))
            m2 = _outcome(lambda: interp.send(b, peer, sender))
            assert m1 == m2 and a == b
            s1, s2 = make_known(), make_known()
            r1 = _outcome(lambda: routers[receiver].receive(msg, s1))
            r2 = _outcome(lambda: interp.receive(msg, s2))
            assert r1 == r2, (msg, s1, r1, r2)
            seen[type(r1).__name__ if not isinstance(r1, tuple) else r1[1].replace("request r1: ", "")[:12]] += 1

    run()
    assert seen["RouteState"] > 500 and len(seen) >= 4, seen  # accepted, and several refusals
