"""The handoff (`tokenrouter.protocol.handoff`: `send` and `receive`), tested on its invariants.

No second implementation is kept to compare it with: the handoff is a few lines of list
slicing, so its invariants are tested directly, from what they mean. Over random token
histories and random sequences of handoffs among 2 to 4 writers (one of them named like an
ensemble: a writer's name is opaque to the handoff), each message going through its JSON
wire form:

- after `receive`, the receiver's tokens are the sender's tokens, and it holds no object
  of the sender's state;
- a message starts where the sender last knew the receiver to be (`peer_read`), which is
  never past what the receiver holds: between two writers it is exactly what the receiver
  had not read (its length = tokens known - what that peer had read); with more writers it
  may repeat tokens the receiver saw since it last met this sender, which must then match;
- `send` records that the peer has read every token, `receive` that the sender has;
- a gap, an overlap that differs, a message that ends before what is known (a stale one),
  an unknown writer or peer, a first message that does not start at 0, and another
  request's state are refused with `MessageError`, leaving the state as it was; a message
  delivered twice changes nothing the second time.

Every generated router's `send`/`receive` (`protocol.router.Router`) is this function.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrouter.protocol import handoff
from tokenrouter.protocol.handoff import MessageError
from tokenrouter.protocol.router import Router
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import PeerMessage, RouteState

SETTINGS = dict(derandomize=True, database=None, deadline=None)
POOL = ("slm", "llm", "mid", "duo")  # "duo" stands for an ensemble writer: the handoff only sees names
TOKENS = st.integers(0, 50_000)


def wire(msg: PeerMessage) -> PeerMessage:
    """The message as the peer gets it: through its JSON form."""
    return PeerMessage.model_validate_json(msg.model_dump_json())


def fresh(tokens, prompt_len=None, writer="slm", **kw) -> RouteState:
    return RouteState(rid="r", tokens=list(tokens), prompt_len=len(tokens) if prompt_len is None else prompt_len,
                      writer=writer, **kw)


@st.composite
def plays(draw):
    """A request's life: writers, prompt, and turns (tokens the holder writes, who is next,
    whether the message is delivered twice, whether an old message turns up first)."""
    writers = tuple(draw(st.permutations(POOL))[:draw(st.integers(2, 4))])
    prompt = draw(st.lists(TOKENS, min_size=1, max_size=12))
    turn = st.tuples(st.lists(TOKENS, max_size=6), st.integers(1, len(writers) - 1), st.booleans(),
                     st.integers(0, 50))
    turns = draw(st.lists(turn, min_size=1, max_size=25))
    meta = st.fixed_dictionaries({"route_seed": st.integers(-(2**63), 2**63 - 1),
                                  "sampling": st.builds(SamplingParams, temperature=st.floats(0, 2),
                                                        top_k=st.integers(0, 50))})
    return writers, prompt, turns, draw(meta)


def test_every_receiver_gets_exactly_the_senders_tokens():
    seen: Counter = Counter()

    @settings(max_examples=400, **SETTINGS)
    @given(plays())
    def run(play):
        _play(play, seen)

    run()
    # each case happened: first visits, returns, repeats (3+ writers), stale and duplicate messages
    assert min(seen[k] for k in ("first visit", "return", "repeat", "stale", "twice")) > 20, seen


def _play(play, seen: Counter) -> None:
    writers, prompt, turns, meta = play
    holder = writers[0]
    states = {holder: fresh(prompt, writer=holder, **meta)}
    history = list(prompt)
    met: dict[tuple[str, str], int] = {}  # (a, b) -> tokens b held when a and b last exchanged, as a knows
    sent: list[PeerMessage] = []  # every message so far, for stale deliveries
    for new, step, twice, old in turns:
        src = states[holder]
        src.tokens.extend(new)
        history.extend(new)
        src.visit_tokens = len(new)
        src.written_by[holder] = src.written_by.get(holder, 0) + len(new)
        dest = writers[(writers.index(holder) + step) % len(writers)]
        src.writer = dest
        known = len(states[dest].tokens) if dest in states else 0
        others = {p: n for p, n in src.peer_read.items() if p != dest}
        read = src.peer_read.get(dest, 0)

        msg = wire(handoff.send(src, dest, holder, writers))
        assert msg.start == read == met.get((holder, dest), 0)
        assert msg.start <= known and msg.suffix == history[msg.start:]
        assert len(msg.suffix) == len(history) - msg.start
        if len(writers) == 2:  # nobody else can have told the receiver anything
            assert msg.start == known
        seen["repeat" if msg.start < known else "return" if dest in states else "first visit"] += 1
        assert src.peer_read == {**others, dest: len(history)}
        met[(holder, dest)] = len(history)

        if sent and dest in states:  # an old message turns up: refused when it ends before what is known
            stale = sent[old % len(sent)]
            if stale.start + len(stale.suffix) < known:
                seen["stale"] += 1
                before = copy.deepcopy(states[dest])
                with pytest.raises(MessageError, match="before the"):
                    handoff.receive(stale, states[dest], writers)
                assert states[dest] == before
        sent.append(msg)

        mine = {p: n for p, n in states[dest].peer_read.items() if p != holder} if dest in states else {}
        got = handoff.receive(msg, states.get(dest), writers)
        assert got.tokens == src.tokens == history
        assert got.peer_read == {**mine, holder: len(history)}
        assert (got.rid, got.prompt_len, got.writer, got.visit_tokens, got.route_seed, got.written_by, got.sampling,
                got.finished) == (src.rid, src.prompt_len, dest, src.visit_tokens, src.route_seed, src.written_by,
                                  src.sampling, src.finished)
        assert got.tokens is not src.tokens and got.written_by is not src.written_by
        assert got.sampling is not src.sampling and got.peer_read is not src.peer_read
        met[(dest, holder)] = len(history)
        if twice:
            seen["twice"] += 1
            after = copy.deepcopy(got)
            assert handoff.receive(msg, got, writers) is got and got == after
        states[dest] = got
        holder = dest


# ------------------------------------------------------------------ refusals


@st.composite
def knowledge(draw):
    """A history, what the receiver knows of it (a prefix), and a message's start and end."""
    history = draw(st.lists(TOKENS, min_size=1, max_size=30))
    known = draw(st.integers(0, len(history)))
    start = draw(st.integers(0, len(history)))
    end = draw(st.integers(start, len(history)))
    return history, known, start, end


def _message(history, start, end, **kw) -> PeerMessage:
    fields = dict(rid="r", suffix=history[start:end], start=start, prompt_len=1, writer="llm", sender="slm")
    return PeerMessage(**{**fields, **kw})


def _outcome(msg, state):
    """What `receive` does with `msg`: the new state, or the refusal's text; a refusal leaves
    the state as it was."""
    before = copy.deepcopy(state)
    try:
        return handoff.receive(msg, state, ("slm", "llm"))
    except MessageError as exc:
        assert state == before
        return str(exc)


@settings(max_examples=500, **SETTINGS)
@given(knowledge(), st.booleans())
def test_a_message_is_taken_only_when_it_lines_up(case, flip):
    history, known, start, end = case
    state = fresh(history[:known], prompt_len=1) if known else None
    suffix = list(history[start:end])
    overlap = range(start, min(known, end))
    if flip and overlap:
        suffix[overlap[len(overlap) // 2] - start] += 1
    out = _outcome(_message(history, start, end, suffix=suffix), state)
    if state is None and start != 0:
        assert out == f"request r: first message starts at token {start}, not 0"
    elif state is not None and start > known:
        assert out == f"request r: gap: message starts at {start}, {known} tokens known"
    elif state is not None and end < known:
        assert out == f"request r: message ends at {end}, before the {known} tokens known"
    elif flip and overlap:
        assert out == f"request r: overlap at {start}..{known} does not match"
    else:
        assert isinstance(out, RouteState)
        assert out.tokens == history[:end] and out.peer_read == {"slm": end}


def test_other_requests_and_unknown_writers_are_refused():
    state = fresh([1, 2, 3], prompt_len=2)
    msg = _message([1, 2, 3, 4], 3, 4, prompt_len=2)
    assert _outcome(msg.model_copy(update={"rid": "q"}), state) == "message for q given the state of r"
    assert _outcome(msg.model_copy(update={"prompt_len": 3}), state) == "request r: prompt length 3 != 2"
    assert _outcome(msg.model_copy(update={"writer": "nobody"}), state) == "request r: unknown writer 'nobody'"
    assert _outcome(msg.model_copy(update={"writer": "nobody", "start": 0}), None) == \
        "request r: unknown writer 'nobody'"
    assert isinstance(_outcome(msg, state), RouteState)


def test_send_refuses_an_unknown_peer_and_a_peer_ahead_of_the_tokens():
    state = fresh([1, 2, 3], peer_read={"llm": 4})
    before = copy.deepcopy(state)
    with pytest.raises(MessageError, match="unknown peer 'nobody'"):
        handoff.send(state, "nobody", "slm", ("slm", "llm"))
    with pytest.raises(MessageError, match="'llm' has read 4 tokens but only 3 exist"):
        handoff.send(state, "llm", "slm", ("slm", "llm"))
    assert state == before


def test_handoff_round_trip_moves_only_unseen_suffixes():
    """slm -> llm -> slm -> llm: each message carries only what its receiver has not read."""
    writers = ("slm", "llm")
    slm = RouteState(rid="q", tokens=[1, 2, 3, 4, 5, 6, 7, 8], prompt_len=5, writer="llm")
    m = handoff.send(slm, "llm", "slm", writers)
    assert (m.start, m.suffix) == (0, [1, 2, 3, 4, 5, 6, 7, 8])
    llm = handoff.receive(m, None, writers)
    assert llm.peer_read == {"slm": 8}
    llm.tokens.append(9)
    llm.writer = "slm"
    m = handoff.send(llm, "slm", "llm", writers)
    assert (m.start, m.suffix) == (8, [9])
    slm = handoff.receive(m, slm, writers)
    assert slm.tokens == list(range(1, 10)) and slm.peer_read == {"llm": 9}
    slm.tokens += [10, 11]
    m = handoff.send(slm, "llm", "slm", writers)
    assert (m.start, m.suffix) == (9, [10, 11])
    assert handoff.receive(m, llm, writers).tokens == list(range(1, 12))
    with pytest.raises(MessageError, match="gap"):
        handoff.receive(m.model_copy(update={"start": 20}), llm, writers)
    with pytest.raises(MessageError, match="does not match"):
        handoff.receive(m.model_copy(update={"start": 8, "suffix": [0, 10, 11]}), llm, writers)


def test_a_generated_writer_class_hands_off_through_this_module():
    class Slm(Router):
        WRITERS, NAME, INDEX = ("slm", "llm", "duo"), "slm", 0

    a, b = fresh([1, 2, 3], peer_read={"duo": 1}), fresh([1, 2, 3], peer_read={"duo": 1})
    assert Slm().send(a, "duo") == handoff.send(b, "duo", "slm", Slm.WRITERS) and a == b
    msg = _message([1, 2, 3, 4], 3, 4, prompt_len=3, writer="duo")
    a, b = fresh([1, 2, 3]), fresh([1, 2, 3])
    assert Slm().receive(msg, a) == handoff.receive(msg, b, Slm.WRITERS)
