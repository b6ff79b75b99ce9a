"""`subserver/forks.py` on a real engine (the tiny pair's small model, float64): a choice
waits for its parent's prefill, then forks its prompt KV and computes only the last prompt
token; every fallback (no parent here, another prompt, a one-token prompt, a failed step,
the parent released while its choices wait) prefills on its own; a choice released while
it waits is forgotten; the KV each choice ends with is a fresh prefill's, and every block
comes back."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.loader import load_model
from tokenrouter.runtime.native.writer import NativeWriter
from tokenrouter.runtime.subserver.forks import Forks
from tokenrouter.runtime.subserver.request import Request

PROMPT = [5, 40, 77, 100, 6, 43, 77, 101, 7, 46]  # 10 tokens: 2 full blocks of 4 and 2


@pytest.fixture
def writer(pair):
    m = load_model(pair["slm"], dtype=torch.float64)
    eng = Engine(m.config, m.weights, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=32))
    return NativeWriter("slm", ("slm",), {"slm": eng}, None, {"forward": 0.0})


def request(rid: str, seq: int, prompt=PROMPT) -> Request:
    st = RouteState(rid=rid, tokens=list(prompt), prompt_len=len(prompt), writer="slm")
    return Request(st, seq, SamplingParams())


def prefill(w: NativeWriter, reqs: list[Request]) -> torch.Tensor:
    """One step of the engine over `reqs` (what the writer's step feeds): their logits."""
    eng = w.engines["slm"]
    return eng.step([(r.seq, r.state.tokens[w.fed(r):]) for r in reqs]).logits


def fresh_logits(w: NativeWriter, tokens: list[int]) -> torch.Tensor:
    eng = w.engines["slm"]
    out = eng.step([("fresh", tokens)]).logits
    eng.free("fresh")
    return out


def test_choices_wait_for_the_prefill_then_fork_and_compute_one_token(writer):
    forks = Forks(writer)
    parent, kids = request("c0", 1), [request(f"c{j}", 1 + j) for j in (1, 2, 3)]
    assert all(forks.arrive(k, parent) for k in kids)  # the parent has not run yet: they wait
    assert forks.stepped([], ok=True) == []
    prefill(writer, [parent])
    assert forks.stepped([parent], ok=True) == kids
    eng = writer.engines["slm"]
    assert forks.forked == 3 and all(writer.fed(k) == len(PROMPT) - 1 for k in kids)
    assert eng.blocks_used == 3 + 3  # the parent's 3; one copied partial block per choice
    logits = prefill(writer, kids)  # each feeds the prompt's last token only
    want = fresh_logits(writer, PROMPT)
    for row in logits:
        torch.testing.assert_close(row, want[0], rtol=0, atol=1e-9)
    late = request("c4", 5)  # a choice that comes once the prefill is done forks at once
    assert not forks.arrive(late, parent) and writer.fed(late) == len(PROMPT) - 1
    writer.release(kids[1])  # one choice ends: only its own references go
    assert eng.blocks_used == 3 + 3
    for r in (parent, kids[0], kids[2], late):
        writer.release(r)
    assert eng.blocks_used == 0


def test_every_fallback_prefills_on_its_own(writer):
    forks = Forks(writer)
    parent = request("p", 1)
    assert not forks.arrive(request("a", 2), None)  # the parent is not here
    assert not forks.arrive(request("b", 3, PROMPT[:-1] + [9]), parent)  # another prompt
    assert not forks.arrive(request("c", 4, [7]), request("p1", 5, [7]))  # one token: nothing to share
    waiting = [request("d", 6), request("e", 7)]
    assert all(forks.arrive(k, parent) for k in waiting)
    assert forks.stepped([parent], ok=False) == waiting  # the parent's step failed: its KV is not trusted
    assert forks.forked == 0 and all(writer.fed(k) == 0 for k in waiting)
    released = [request("f", 8), request("g", 9)]
    assert all(forks.arrive(k, parent) for k in released)
    assert forks.release("f") == []  # a waiting choice ends: forgotten
    assert forks.release("p") == [released[1]]  # the parent ends first: the rest go on their own
    assert forks.held == {} and forks.parent == {} and forks.forked == 0
    assert writer.engines["slm"].blocks_used == 0


def test_no_free_block_for_the_copy_prefills_on_its_own(pair):
    m = load_model(pair["slm"], dtype=torch.float64)
    eng = Engine(m.config, m.weights, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=3))
    w = NativeWriter("slm", ("slm",), {"slm": eng}, None, {"forward": 0.0})
    forks, parent, kid = Forks(w), request("p", 1), request("k", 2)
    prefill(w, [parent])  # all 3 blocks
    assert not forks.arrive(kid, parent) and w.fed(kid) == 0 and forks.forked == 0
    assert eng.blocks_used == 3
