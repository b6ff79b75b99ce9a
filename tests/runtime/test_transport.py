"""Real ZeroMQ sockets over inproc, ipc and tcp."""

import queue
import socket

import pytest
import zmq

from tokenrouter.runtime import wire
from tokenrouter.runtime.transport import AddressError, Receiver, Sender, cleanup_ipc, make_addresses


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["inproc", "ipc", "tcp"])
def test_frames_arrive_in_order_per_sender(kind):
    ctx = zmq.Context()
    if kind == "tcp":
        addrs = {"a": f"tcp://127.0.0.1:{_free_port()}"}
    else:
        addrs = make_addresses(["a"], kind)
    got: queue.Queue = queue.Queue()
    rx = Receiver(ctx, addrs["a"], got.put)
    tx1, tx2 = Sender(ctx, addrs), Sender(ctx, addrs)
    for i in range(200):
        tx1.send("a", wire.encode(wire.Announce(rid=f"one-{i}")))
        tx2.send("a", wire.encode(wire.Announce(rid=f"two-{i}")))
    frames = [wire.decode(got.get(timeout=10)) for _ in range(400)]
    for who in ("one", "two"):
        seq = [int(m.rid.split("-")[1]) for m in frames if m.rid.startswith(who)]
        assert seq == list(range(200))
    tx1.close()
    tx2.close()
    rx.stop()
    ctx.term()
    cleanup_ipc(addrs)


def test_a_failing_handler_does_not_stop_the_receiver():
    ctx = zmq.Context()
    addrs = make_addresses(["a"], "inproc")
    got: queue.Queue = queue.Queue()

    def handler(frame):
        if frame == b"boom":
            raise ValueError("bad frame")
        got.put(frame)

    rx = Receiver(ctx, addrs["a"], handler)
    tx = Sender(ctx, addrs)
    tx.send("a", b"boom")
    tx.send("a", b"fine")
    assert got.get(timeout=5) == b"fine"
    tx.close()
    rx.stop()
    ctx.term()


def test_bad_addresses():
    with pytest.raises(AddressError):
        Sender(zmq.Context.instance(), {"a": "http://x"})
    with pytest.raises(AddressError):
        make_addresses(["a"], "udp")
