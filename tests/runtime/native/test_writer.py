"""`runtime/native/`: `load_writer` and `NativeWriter` on the tiny pair (float64). A request
that leaves keeps its KV (pending), and its return feeds only the suffix it has not seen,
whose logits are a fresh prefill's; an ensemble steps every member on one batch, samples
from the compiled `combine` of their distributions, and frees its sequence in each."""

from __future__ import annotations

import torch

from tests.helpers import tiny
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.native import NativeWriter, load_writer
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.subserver.setup import SubserverSpec

PROMPT = [5, 40, 77, 100, 6, 43, 77, 101, 7, 46]


def loaded(program, writer: str) -> NativeWriter:
    spec = SubserverSpec(program_json=program.to_json(), writer=writer, addresses={}, block_size=4, num_blocks=64)
    w = load_writer(spec, dict.fromkeys(("forward", "sample", "route"), 0.0)).engine
    assert isinstance(w, NativeWriter)
    return w


def request(writer: str, seq: int = 1) -> Request:
    return Request(RouteState(rid="r", tokens=list(PROMPT), prompt_len=len(PROMPT), writer=writer), seq,
                   SamplingParams())


def fresh_logits(w: NativeWriter, member: str, tokens: list[int]) -> torch.Tensor:
    eng = w.engines[member]
    out = eng.step([("fresh", tokens)]).logits[-1]
    eng.free("fresh")
    return out


def test_a_return_feeds_only_its_unseen_suffix_and_computes_a_fresh_prefills_logits(pair):
    w = loaded(tiny.rstitch(pair, tau=0.5), "slm")
    r = request("slm")
    assert w.feed([r]) == len(PROMPT)  # first visit: the prompt
    (token, _, _, _), = w.step([r])
    assert w.fed(r) == len(PROMPT)
    # the request leaves with its token; the other writer adds three; it comes back
    r.state.tokens += [token, 11, 12, 13]
    assert w.feed([r]) == 4  # an extend by the suffix, not a prefill of 14 tokens
    assert w.computed_tokens == len(PROMPT) + 4
    served = w.engines["slm"].step(w.items, w.router.needs).logits[-1]
    torch.testing.assert_close(served, fresh_logits(w, "slm", r.state.tokens), rtol=0, atol=1e-9)
    used = w.engines["slm"].blocks_used
    w.park(r)  # pending: the KV stays
    assert w.engines["slm"].blocks_used == used and w.fed(r) == len(r.state.tokens)
    w.release(r)
    assert w.engines["slm"].blocks_used == 0 and w.fed(r) == 0


def test_an_ensemble_steps_every_member_and_samples_from_their_combination(pair):
    program = tiny.ensemble(pair)
    w = loaded(program, "avg")
    assert w.members == ("slm", "llm") and w.ensemble
    r = request("avg")
    assert w.feed([r]) == len(PROMPT)
    (token, _, _, _), = w.step([r])
    assert all(w.engines[m].seq_len(r.seq) == len(PROMPT) for m in w.members)
    # average: the weighted mean of the members' probabilities (weights 0.6, 0.4); greedy
    mixed = sum(wt * torch.softmax(fresh_logits(w, m, PROMPT), -1) for m, wt in zip(w.members, (0.6, 0.4)))
    assert token == int(mixed.argmax())
    assert w.kv_usage()[0] == 2 * 3  # 10 tokens in blocks of 4, in each member
    w.release(r)
    assert w.kv_usage()[0] == 0
