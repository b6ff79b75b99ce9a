"""Real ZeroMQ sockets over inproc, ipc and tcp."""

import queue

import pytest
import zmq

from tests.helpers.ports import free_port
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.transport.security import Security, SecurityError, generate_keys, stop_authenticator
from tokenrouter.runtime.transport.sockets import AddressError, Receiver, Sender, cleanup_ipc, make_addresses


@pytest.mark.parametrize("kind", ["inproc", "ipc", "tcp"])
def test_frames_arrive_in_order_per_sender(kind):
    ctx = zmq.Context()
    sec = None
    if kind == "tcp":
        addrs = {"a": f"tcp://127.0.0.1:{free_port()}"}
        sec = Security.for_launch(None, False, addrs)  # keys made for this launch
        assert sec.curve and sec.launch_pair
    else:
        addrs = make_addresses(["a"], kind)
    got: queue.Queue = queue.Queue()
    rx = Receiver(ctx, addrs["a"], got.put, security=sec)
    tx1, tx2 = Sender(ctx, addrs, sec), Sender(ctx, addrs, sec)
    for i in range(200):
        tx1.send("a", wire.encode(wire.Announce(to=1, rid=f"one-{i}")))
        tx2.send("a", wire.encode(wire.Announce(to=1, rid=f"two-{i}")))
    frames = [wire.decode(got.get(timeout=10)) for _ in range(400)]
    for who in ("one", "two"):
        seq = [int(m.rid.split("-")[1]) for m in frames if m.rid.startswith(who)]
        assert seq == list(range(200))
    tx1.close()
    tx2.close()
    rx.stop()
    stop_authenticator(ctx)
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


@pytest.mark.slow
def test_curve_tcp_admits_only_holders_of_the_keys_and_counts_the_others(tmp_path):
    generate_keys(str(tmp_path / "ours"))
    generate_keys(str(tmp_path / "theirs"))
    ours, theirs = Security.load(str(tmp_path / "ours")), Security.load(str(tmp_path / "theirs"))
    addrs = {"a": f"tcp://127.0.0.1:{free_port()}"}
    rx_ctx, tx_ctx = zmq.Context(), zmq.Context()
    got: queue.Queue = queue.Queue()
    refused = []
    rx = Receiver(rx_ctx, addrs["a"], got.put, security=ours, on_refused=lambda: refused.append(1))
    plain, wrong, right = (Sender(tx_ctx, addrs, Security(insecure=True)), Sender(tx_ctx, addrs, theirs),
                           Sender(tx_ctx, addrs, ours))
    plain.send("a", b"from a plain peer")
    wrong.send("a", b"from someone else's keys")
    right.send("a", b"from us")
    assert got.get(timeout=10) == b"from us"
    with pytest.raises(queue.Empty):
        got.get(timeout=1.5)  # the others never got through the handshake
    assert len(refused) >= 2  # each refused at the handshake, and counted (zmq retries a plain peer)
    for s in (plain, wrong, right):
        s.close()
    rx.stop()
    stop_authenticator(rx_ctx)
    rx_ctx.term()
    tx_ctx.term()


def test_plain_tcp_is_refused_unless_told_even_on_loopback(tmp_path):
    ctx = zmq.Context()
    port = free_port()
    for addr in (f"tcp://0.0.0.0:{port}", f"tcp://*:{port}", f"tcp://127.0.0.1:{port}"):
        with pytest.raises(SecurityError, match="--curve-keys"):
            Receiver(ctx, addr, lambda f: None)
    rx = Receiver(ctx, f"tcp://0.0.0.0:{port}", lambda f: None, security=Security(insecure=True))
    rx.stop()
    # a launch makes keys for its own tcp sockets, but cannot for a subserver started elsewhere
    assert Security.for_launch(None, False, {"a": f"tcp://127.0.0.1:{port}"}).curve
    assert not Security.for_launch(None, False, {"a": "ipc:///tmp/x"}).curve
    with pytest.raises(SecurityError, match="started elsewhere"):
        Security.for_launch(None, False, {"a": f"tcp://127.0.0.1:{port}"}, remote=("a",))
    with pytest.raises(SecurityError, match="keygen"):
        Security.load(str(tmp_path / "none"))
    generate_keys(str(tmp_path / "k"))
    with pytest.raises(SecurityError, match="exists"):
        generate_keys(str(tmp_path / "k"))
    ctx.term()
