"""The wire format: explicit, versioned JSON; never pickle."""

import pickle

import pytest

from tokenrouter.protocol.state import PeerMessage
from tokenrouter.runtime.transport import wire


def test_every_message_round_trips():
    pm = PeerMessage(rid="r1", suffix=[5, 6, 7], start=12, prompt_len=10, writer="llm", visit_tokens=0,
                     route_seed=3, written_by={"slm": 2}, sampling={"temperature": 0.0}, sender="slm")
    msgs = [wire.Submit(to=7, rid="r1", prompt=[1, 2], sampling={"max_tokens": 4}, route_seed=9),
            wire.Announce(to=7, rid="r1"), wire.Release(to=7, rid="r1", reason="abort"),
            wire.Handoff(sender="slm", inc=5, to=7, dest="llm", msg=pm, refill=True),
            wire.Resume(to=7, msg=pm.model_copy(update={"start": 0, "hops": 3})),
            wire.Ready(writer="slm", pid=1, inc=5, block_size=16, blocks_total=10, max_model_len=64,
                       vocab_size=259, threads=1, batch_threshold=1, max_wait_ms=20.0),
            wire.Heartbeat(writer="slm", pid=1, inc=5),
            wire.Tokens(writer="slm", inc=5, items=[("r1", 0, 5, "slm"), ("r2", 3, 7, "llm")]),
            wire.Done(writer="slm", inc=5, rid="r1", reason="stop", n_out=3, written_by={"slm": 3}),
            wire.Stats(to=7, id=4), wire.StatsReply(id=4, writer="slm", inc=5, stats={"x": 1}),
            wire.Shutdown(to=7), wire.DebugFail(to=7, count=2),
            wire.Peers(to=7, incarnations={"slm": 5, "llm": 0}),
            wire.PeerDown(to=7, round=1, writer="slm", inc=5, have={"r1": 3}),
            wire.Census(writer="llm", inc=7, round=1, entries=[
                wire.CensusEntry(rid="r1", hops=2, status="pending", dest="slm", n_out=4, tail=[9])])]
    for m in msgs:
        frame = wire.encode(m)
        assert frame.startswith(b"{")  # JSON text, readable on the wire
        assert wire.decode(frame) == m


def test_handoff_carries_only_what_it_says():
    pm = PeerMessage(rid="r", suffix=[1], start=4, prompt_len=3, writer="llm")
    frame = wire.encode(wire.Handoff(sender="slm", inc=5, to=7, dest="llm", msg=pm))
    back = wire.decode(frame)
    assert back.msg.suffix == [1] and back.msg.start == 4


@pytest.mark.parametrize("frame, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"v": 99, "t": "submit", "rid": "x", "prompt": [1]}', "wire version"),
    (b'{"v": 1, "t": "launch_missiles"}', "invalid"),
    (b'{"v": 1, "t": "submit", "rid": "x"}', "invalid 'submit'"),
    (b'{"v": 1, "t": "submit", "rid": "x", "prompt": [1], "evil": 1}', "invalid 'submit'"),
    (pickle.dumps(wire.Shutdown(to=1)), "not JSON"),
    (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    (b'{"v": 1, "t": "announce", "to": 1, "rid": "x", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
     "nested too deeply"),
    (b'{"v": 1, "t": "submit", "to": 0, "rid": "x", "prompt": [1]}', "invalid 'submit'"),  # no incarnation 0
])
def test_bad_frames_are_rejected_with_a_reason(frame, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(frame)
