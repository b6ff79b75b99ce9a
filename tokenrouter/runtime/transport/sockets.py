"""ZeroMQ plumbing: every endpoint binds one PULL socket and PUSHes to the others.

An address is a ZeroMQ endpoint, so the same code runs in one process (`inproc://`, the
thread mode of the tests, sharing one `zmq.Context`), across processes on one host
(`ipc://`, the default) and across hosts (`tcp://host:port`). PUSH/PULL keeps the order of
the frames of one sender, never blocks a sender on a slow receiver (unlimited send queue),
and needs no reply: the runtime is asynchronous on purpose.

Sockets are not thread-safe, so each has one owner: a `Receiver` owns its PULL socket in
its own thread (the messaging loop), a `Sender` belongs to the thread that sends.

A `Receiver` binds and a `Sender` connects through `security.py`, which makes a tcp socket a
CURVE server or client when the deployment has keys and refuses a plain tcp bind open to the
network.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from typing import Callable

import zmq

from tokenrouter.runtime.transport.security import Security, refused, secure_bind, secure_connect, watch_handshakes
from tokenrouter.runtime.transport.wire import MAX_FRAME

log = logging.getLogger(__name__)

POLL_MS = 200  # how often a receiver checks for its stop flag
RCVHWM = 10_000  # frames a PULL socket queues before senders hold theirs (bounded memory)


def bound_receive(sock: zmq.Socket) -> None:
    """Bound what a PULL socket accepts: at most `wire.MAX_FRAME` bytes per frame (ZeroMQ
    drops a connection that sends more, before the frame is read) and `RCVHWM` frames."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)


class AddressError(ValueError):
    """An endpoint string ZeroMQ cannot use."""


def check_address(addr: str) -> str:
    if not addr.startswith(("inproc://", "ipc://", "tcp://")):
        raise AddressError(f"address {addr!r} must start with inproc://, ipc:// or tcp://")
    return addr


def bind_form(addr: str) -> str:
    """Where to bind for an address others connect to: a tcp host binds on all interfaces
    when given as `tcp://0.0.0.0:port` or `tcp://*:port`; otherwise exactly as given."""
    return addr.replace("tcp://0.0.0.0:", "tcp://*:")


def make_addresses(names: list[str], kind: str = "ipc") -> dict[str, str]:
    """Fresh endpoints for the frontend and each subserver: inproc names (threads in one
    process) or ipc files in a new private temporary folder (processes on one host)."""
    if kind == "inproc":
        tag = f"{os.getpid()}-{id(names):x}-{os.urandom(3).hex()}"
        return {n: f"inproc://tr-{tag}-{i}" for i, n in enumerate(names)}
    if kind == "ipc":
        folder = tempfile.mkdtemp(prefix="tr-")
        return {n: f"ipc://{folder}/{i}.sock" for i, n in enumerate(names)}
    raise AddressError(f"address kind {kind!r} is not inproc or ipc (give tcp addresses explicitly)")


def cleanup_ipc(addresses: dict[str, str]) -> None:
    """Remove the socket files and folder `make_addresses` created."""
    folders = set()
    for addr in addresses.values():
        if addr.startswith("ipc://"):
            path = addr[len("ipc://"):]
            folders.add(os.path.dirname(path))
            try:
                os.unlink(path)
            except OSError:
                pass
    for f in folders:
        try:
            os.rmdir(f)
        except OSError:
            pass


class Sender:
    """PUSH sockets to named endpoints, used by one thread."""

    def __init__(self, ctx: zmq.Context, addresses: dict[str, str] | None = None,
                 security: Security | None = None):
        self._ctx = ctx
        self._security = security
        self._socks: dict[str, zmq.Socket] = {}
        for name, addr in (addresses or {}).items():
            self.connect(name, addr)

    def connect(self, name: str, addr: str) -> None:
        s = self._ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.LINGER, 2000)
        secure_connect(s, check_address(addr), self._security)
        s.connect(addr)
        self._socks[name] = s

    def send(self, name: str, frame: bytes) -> None:
        self._socks[name].send(frame, copy=False)

    def names(self) -> list[str]:
        return list(self._socks)

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()


class Receiver:
    """A PULL socket bound at `addr`, read by a daemon thread that hands each frame to
    `handler(frame)`. The handler runs in the receiver's thread and must be quick.
    `on_refused()` is called for every peer refused at the handshake (CURVE tcp)."""

    def __init__(self, ctx: zmq.Context, addr: str, handler: Callable[[bytes], None],
                 name: str = "receiver", security: Security | None = None,
                 on_refused: Callable[[], None] | None = None):
        self._sock = ctx.socket(zmq.PULL)
        bound_receive(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            secure_bind(self._sock, check_address(addr), security)
            self._sock.bind(bind_form(addr))
        except BaseException:
            self._sock.close(0)
            raise
        self._monitor = watch_handshakes(self._sock, addr, security)
        self._on_refused = on_refused or (lambda: None)
        self._handler = handler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The messaging loop runs (a subserver beats only while it does)."""
        return self._thread.is_alive()

    def _loop(self) -> None:
        sock, mon = self._sock, self._monitor
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if mon is not None:
            poller.register(mon, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if mon is not None and mon in ready:
                    while mon.poll(0):
                        if refused(mon.recv_multipart()):
                            self._on_refused()
                if sock not in ready:
                    continue
                while True:
                    try:
                        frame = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._handler(frame)
                    except Exception:  # a bad frame must not kill the messaging loop
                        log.exception("dropping a frame the handler could not take")
        finally:
            if mon is not None:
                sock.disable_monitor()
                mon.close(0)
            sock.close()

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
