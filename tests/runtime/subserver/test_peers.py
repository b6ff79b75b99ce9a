"""Hostile or broken peers: a subserver driven over a real tcp loopback socket by a test
that plays the frontend (holding the launch's CURVE keys), a stranger without them, and a
peer that holds them but sends what makes no sense. Every bad frame is dropped and counted,
a frame that is valid but cannot run fails only its own request, test-only messages are
refused without test hooks, a stranger gets no frame through, a frame meant for another
incarnation is dropped, and the subserver keeps serving throughout."""

import json
import threading
import time

import pytest
import zmq

from tests.helpers import tiny
from tests.helpers.ports import free_port
from tokenrouter.protocol.state import PeerMessage
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.launch import LaunchOptions, plan
from tokenrouter.runtime.subserver.subserver import Subserver
from tokenrouter.runtime.transport.security import Security, secure_bind, secure_connect, stop_authenticator


class Peer:
    """One subserver (slm of the coin program, in a thread) and the test's sockets."""

    def __init__(self, program, test_hooks: bool):
        self.addrs = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("frontend", "slm", "llm")}
        self.sec = Security.for_launch(None, False, self.addrs)  # what a launch makes
        spec = plan(program, LaunchOptions(mode="thread", addresses=self.addrs, num_blocks=64), self.sec)["slm"]
        spec.test_hooks = test_hooks
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        secure_bind(self.pull, self.addrs["frontend"], self.sec)
        self.pull.bind(self.addrs["frontend"])
        self.sub = Subserver(spec, ctx=self.ctx)
        self.thread = threading.Thread(target=self.sub.serve, daemon=True)
        self.thread.start()
        self.push = self.ctx.socket(zmq.PUSH)
        secure_connect(self.push, self.addrs["slm"], self.sec)
        self.push.connect(self.addrs["slm"])
        self.inc = self.expect(wire.Ready).inc
        self.send(wire.encode(wire.Peers(to=self.inc, incarnations={"slm": self.inc, "llm": 77})))

    def send(self, frame) -> None:
        self.push.send(frame if isinstance(frame, bytes) else json.dumps(frame).encode())

    def expect(self, kind, rid=None, timeout_ms=20000):
        while True:
            assert self.pull.poll(timeout_ms), f"no {kind.__name__} arrived"
            m = wire.decode(self.pull.recv())
            if isinstance(m, kind) and (rid is None or getattr(m, "rid", None) == rid):
                return m

    def serves(self, rid: str) -> wire.Done:
        """A valid request (slm alone: p = 0, so it never hands off) runs to its end."""
        self.send(wire.encode(wire.Submit(to=self.inc, rid=rid, prompt=[5, 6, 7],
                                          sampling={"max_tokens": 3, "temperature": 0.0})))
        done = self.expect(wire.Done, rid)
        self.send(wire.encode(wire.Release(to=self.inc, rid=rid)))
        return done

    def stats(self) -> dict:
        self.send(wire.encode(wire.Stats(to=self.inc, id=1)))
        return self.expect(wire.StatsReply).stats

    def dropped(self) -> dict[str, int]:
        return self.stats()["frames_dropped"]

    def close(self):
        self.send(wire.encode(wire.Shutdown(to=self.inc)))
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.push.close(0)
        self.pull.close(0)
        stop_authenticator(self.ctx)
        self.ctx.term()


@pytest.fixture
def peer(pair):
    p = Peer(tiny.coin(pair, 0.0), test_hooks=False)
    yield p
    p.close()


CRAFTED = [
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "sampling": {"max_tokens": "x"}},  # the frame
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "sampling": {"temperature": "hot"}},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "sampling": {"top_p": 0}},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "sampling": {"stop_token_ids": ["a"]}},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "sampling": {"evil": 1}},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "route_seed": 1208925819614629174706176},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [-1]},
    {"v": 1, "t": "submit", "rid": "x", "prompt": []},
    {"v": 1, "t": "submit", "rid": "x" * 10000, "prompt": [1]},
    {"v": 1, "t": "submit", "rid": "x", "prompt": [1], "to": "INC", "extra": [[[[[]]]]]},
    {"v": 1, "t": "configure", "batch_threshold": 10 ** 30},
    {"v": 1, "t": "handoff", "sender": "llm", "inc": 77, "dest": "slm",
     "msg": {"rid": "h", "suffix": [1], "start": 0, "prompt_len": 1, "writer": "slm",
             "sampling": {"max_tokens": "x"}}},
    {"v": 1, "t": "handoff", "sender": "llm", "inc": 77, "dest": "slm",
     "msg": {"rid": "h", "suffix": [-5], "start": 0, "prompt_len": 1, "writer": "slm"}},
    {"v": 1, "t": "ready", "writer": "slm", "pid": 1, "block_size": 16, "blocks_total": 1, "max_model_len": 1,
     "vocab_size": 1, "threads": 1, "batch_threshold": 1, "max_wait_ms": float("nan")},
    {"v": 1, "t": "ready", "writer": "slm", "pid": 1, "inc": 5, "block_size": 16, "blocks_total": 1,
     "max_model_len": 1, "vocab_size": 1, "threads": 1, "batch_threshold": 1, "max_wait_ms": 1.0},  # valid, not ours
]


def test_crafted_frames_are_dropped_counted_and_the_subserver_keeps_serving(peer):
    for frame in CRAFTED:
        peer.send(json.loads(json.dumps(frame).replace('"INC"', str(peer.inc))))
    peer.send(b"\xff" * 100)  # not JSON
    peer.send(b"[" * 50_000 + b"]" * 50_000)  # 100 KB nested past the parser's guard
    assert peer.serves("after").reason == "length"
    assert peer.dropped()["invalid"] == len(CRAFTED) + 2


def test_valid_frames_that_cannot_run_fail_only_their_own_request(peer):
    vocab, inc = peer.sub.vocab_size, peer.inc
    peer.send(wire.encode(wire.Submit(to=inc, rid="big", prompt=[vocab + 5], sampling={"max_tokens": 2})))
    assert "outside the vocabulary" in peer.expect(wire.Done, "big").error
    long = [1] * (peer.sub.max_model_len + 1)
    peer.send(wire.encode(wire.Submit(to=inc, rid="long", prompt=long, sampling={"max_tokens": 2})))
    assert "context" in peer.expect(wire.Done, "long").error
    pm = PeerMessage(rid="h", suffix=[1, 2], start=40, prompt_len=3, writer="slm", sender="llm", hops=1)
    peer.send(wire.encode(wire.Handoff(sender="llm", inc=77, to=inc, dest="slm", msg=pm)))  # starts where no one read
    assert peer.expect(wire.Done, "h").reason == "error"
    for rid in ("big", "long", "h"):
        peer.send(wire.encode(wire.Release(to=inc, rid=rid)))
    assert peer.serves("after").reason == "length"


def test_an_oversized_frame_is_refused_before_it_is_read(peer):
    peer.send(b'{"v": 1, "t": "announce", "to": 1, "rid": "' + b"x" * (wire.MAX_FRAME + 1) + b'"}')
    assert peer.serves("after").reason == "length"  # the connection was dropped, not the process
    with pytest.raises(wire.WireError, match="over the"):
        wire.decode(b" " * (wire.MAX_FRAME + 1))


def test_test_only_messages_are_refused_without_test_hooks(peer):
    peer.send(wire.encode(wire.DebugFail(to=peer.inc, count=5)))
    assert peer.serves("after").reason == "length"  # no injected failure
    assert peer.dropped()["test_only"] == 1


def test_with_test_hooks_an_injected_step_failure_fails_the_step_and_the_loop_goes_on(pair):
    p = Peer(tiny.coin(pair, 0.0), test_hooks=True)
    try:
        p.send(wire.encode(wire.DebugFail(to=p.inc, count=1)))
        assert "injected step failure" in p.serves("fails").error
        assert p.serves("after").reason == "length"
    finally:
        p.close()


def test_frames_for_another_incarnation_or_from_a_dead_one_are_dropped_as_stale(peer):
    """A restarted process binds its predecessor's address, so what was queued for that one
    reaches it: meant for another incarnation, it is dropped. A handoff from an incarnation
    the frontend declared dead is dropped too, and a resume older than the copy here."""
    other = peer.inc ^ 1
    peer.send(wire.encode(wire.Shutdown(to=other)))
    peer.send(wire.encode(wire.Configure(to=other, batch_threshold=9)))
    peer.send(wire.encode(wire.Submit(to=other, rid="old", prompt=[1, 2], sampling={"max_tokens": 2})))
    assert peer.serves("after").reason == "length"  # neither stopped nor reconfigured
    assert peer.stats()["batch_threshold"] == 1 and peer.dropped()["stale"] == 3
    peer.send(wire.encode(wire.PeerDown(to=peer.inc, round=1, writer="llm", inc=77, have={})))
    census = peer.expect(wire.Census)
    assert census.round == 1 and census.entries == []
    pm = PeerMessage(rid="late", suffix=[1, 2], start=0, prompt_len=2, writer="slm", sender="llm", hops=1)
    peer.send(wire.encode(wire.Handoff(sender="llm", inc=77, to=peer.inc, dest="slm", msg=pm)))
    assert peer.serves("after2").reason == "length"
    assert peer.dropped()["stale"] == 4 and "late" not in peer.sub.reqs


def test_a_stranger_without_the_keys_gets_no_frame_through(peer):
    """Plain tcp to a subserver of a launch: every forged message is refused at the
    handshake and counted; no work runs, nothing is reconfigured, nothing stops."""
    ctx = zmq.Context()
    stranger = ctx.socket(zmq.PUSH)
    # once the refused handshake drops its only connection, a PUSH socket has nowhere to
    # queue a frame and send() blocks: that is a frame kept out too, so it gives up after 1 s
    stranger.setsockopt(zmq.SNDTIMEO, 1000)
    stranger.connect(peer.addrs["slm"])
    for m in (wire.Submit(to=peer.inc, rid="evil", prompt=[1, 2, 3], sampling={"max_tokens": 50}),
              wire.Configure(to=peer.inc, batch_threshold=64), wire.Announce(to=peer.inc, rid="ghost"),
              wire.Shutdown(to=peer.inc)):
        try:
            stranger.send(wire.encode(m))
        except zmq.Again:
            pass
    deadline = time.monotonic() + 10
    while peer.dropped().get("unauthenticated", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = peer.stats()
    assert stats["frames_dropped"].get("unauthenticated", 0) >= 1
    assert stats["batch_threshold"] == 1 and stats["requests"] == 0 and stats["blocks_used"] == 0
    assert peer.serves("after").reason == "length" and peer.thread.is_alive()
    stranger.close(0)
    ctx.term()
