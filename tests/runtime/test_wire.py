"""The wire format: explicit, versioned JSON; never pickle."""

import pickle

import pytest

from tokenrouter.protocol.state import PeerMessage
from tokenrouter.runtime.transport import wire


def test_every_message_round_trips():
    pm = PeerMessage(rid="r1", suffix=[5, 6, 7], start=12, prompt_len=10, writer="llm", visit_tokens=0,
                     route_seed=3, written_by={"slm": 2}, sampling={"temperature": 0.0}, sender="slm")
    msgs = [wire.Submit(rid="r1", prompt=[1, 2], sampling={"max_tokens": 4}, route_seed=9),
            wire.Announce(rid="r1"), wire.Release(rid="r1", reason="abort"),
            wire.Handoff(sender="slm", dest="llm", msg=pm),
            wire.Ready(writer="slm", pid=1, block_size=16, blocks_total=10, max_model_len=64, vocab_size=259,
                       threads=1, batch_threshold=1, max_wait_ms=20.0),
            wire.Tokens(writer="slm", items=[("r1", 0, 5), ("r2", 3, 7)]),
            wire.Done(rid="r1", reason="stop", n_out=3, written_by={"slm": 3}),
            wire.Stats(id=4), wire.StatsReply(id=4, writer="slm", stats={"x": 1}),
            wire.Shutdown(), wire.DebugFail(count=2)]
    for m in msgs:
        frame = wire.encode(m)
        assert frame.startswith(b"{")  # JSON text, readable on the wire
        assert wire.decode(frame) == m


def test_handoff_carries_only_what_it_says():
    pm = PeerMessage(rid="r", suffix=[1], start=4, prompt_len=3, writer="llm")
    frame = wire.encode(wire.Handoff(sender="slm", dest="llm", msg=pm))
    back = wire.decode(frame)
    assert back.msg.suffix == [1] and back.msg.start == 4


@pytest.mark.parametrize("frame, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"v": 99, "t": "submit", "rid": "x", "prompt": [1]}', "wire version"),
    (b'{"v": 1, "t": "launch_missiles"}', "invalid"),
    (b'{"v": 1, "t": "submit", "rid": "x"}', "invalid 'submit'"),
    (b'{"v": 1, "t": "submit", "rid": "x", "prompt": [1], "evil": 1}', "invalid 'submit'"),
    (pickle.dumps(wire.Shutdown()), "not JSON"),
])
def test_bad_frames_are_rejected_with_a_reason(frame, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(frame)
