"""ZeroMQ plumbing: every endpoint binds one PULL socket and PUSHes to the others.

An address is a ZeroMQ endpoint, so the same code runs in one process (`inproc://`, the
thread mode of the tests, sharing one `zmq.Context`), across processes on one host
(`ipc://`, the default) and across hosts (`tcp://host:port`). PUSH/PULL keeps the order of
the frames of one sender, never blocks a sender on a slow receiver (unlimited send queue),
and needs no reply: the runtime is asynchronous on purpose.

Sockets are not thread-safe, so each has one owner: a `Receiver` owns its PULL socket in
its own thread (the messaging loop), a `Sender` belongs to the thread that sends.

TCP between hosts is authenticated and encrypted with ZeroMQ CURVE when a key folder is
given (`Security`, keys from `tokenrouter keygen`): every tcp PULL socket is a CURVE
server that admits only clients holding the deployment's key pair (checked by a ZAP
handler in each process), every PUSH a CURVE client. Without keys a tcp socket may bind
only to a loopback address, unless the operator opts in (`insecure=True`,
`--insecure-tcp`). inproc and ipc (one host, file permissions) are unaffected.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable

import zmq
import zmq.auth
import zmq.auth.thread

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


KEY_NAME = "tokenrouter"  # keygen writes tokenrouter.key and tokenrouter.key_secret
_ZAP_DOMAIN = "tokenrouter"


class SecurityError(ValueError):
    """Missing or unreadable keys, or a tcp bind that would be open to the network."""


def generate_keys(folder: str) -> tuple[str, str]:
    """Write a new CURVE key pair into `folder` (created); the secret file is made
    readable by its owner only. Returns (public file, secret file)."""
    os.makedirs(folder, exist_ok=True)
    public, secret = (os.path.join(folder, KEY_NAME + ext) for ext in (".key", ".key_secret"))
    if os.path.exists(secret):
        raise SecurityError(f"{secret} exists; remove it first (or choose another folder)")
    public, secret = zmq.auth.create_certificates(folder, KEY_NAME)
    os.chmod(secret, 0o600)
    return public, secret


@dataclass(frozen=True)
class Security:
    """How tcp sockets are protected: CURVE keys (public, secret; z85 bytes), or none."""

    public: bytes | None = None
    secret: bytes | None = None
    insecure: bool = False  # no keys, and plain tcp allowed on non-loopback addresses

    @classmethod
    def load(cls, folder: str | None, insecure: bool = False) -> "Security":
        if folder is None:
            return cls(insecure=insecure)
        path = os.path.join(folder, KEY_NAME + ".key_secret")
        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise SecurityError(f"cannot read the CURVE key pair {path} ({exc}); make one with "
                                f"`tokenrouter keygen {folder}`") from None
        if not secret:
            raise SecurityError(f"{path} has no secret key")
        return cls(public=public, secret=secret)

    @property
    def curve(self) -> bool:
        return self.secret is not None


_AUTHENTICATORS: dict[int, object] = {}  # one ZAP handler per ZeroMQ context
_AUTH_LOCK = threading.Lock()


def _start_authenticator(sock: zmq.Socket, sec: Security) -> None:
    """Start (once per context) the ZAP handler that admits only our own public key."""
    ctx = sock.context
    key = ctx.underlying
    with _AUTH_LOCK:
        if key in _AUTHENTICATORS:
            return
        auth = zmq.auth.thread.ThreadAuthenticator(zmq.Context.shadow(key))
        auth.start()

        class _Ours:
            def callback(self, domain, client_key):
                return client_key == sec.public

        auth.configure_curve_callback(domain=_ZAP_DOMAIN, credentials_provider=_Ours())
        _AUTHENTICATORS[key] = auth


def _is_tcp_loopback(addr: str) -> bool:
    host = addr[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # *, 0.0.0.0 (ip_address says unspecified), an interface or host name


def stop_authenticator(ctx: zmq.Context) -> None:
    """Stop the context's ZAP handler (before `ctx.term()`, which would wait for it)."""
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.pop(ctx.underlying, None)
    if auth is not None:
        auth.stop()


def check_bind(addr: str, sec: Security | None) -> None:
    """Refuse a plain tcp bind on a non-loopback address unless the operator opted in."""
    sec = sec or Security()
    if addr.startswith("tcp://") and not sec.curve and not sec.insecure and not _is_tcp_loopback(addr):
        raise SecurityError(f"binding {addr} without CURVE keys would let anyone on the network send "
                            f"this process commands: give --curve-keys DIR (`tokenrouter keygen DIR`), "
                            f"or --insecure-tcp on a network you trust")


def secure_bind(sock: zmq.Socket, addr: str, sec: Security | None) -> None:
    """Make `sock` a CURVE server before it binds to a tcp address (or refuse a plain
    non-loopback bind). Call before `bind`."""
    if not addr.startswith("tcp://"):
        return
    check_bind(addr, sec)
    if sec is not None and sec.curve:
        _start_authenticator(sock, sec)
        sock.zap_domain = _ZAP_DOMAIN.encode()
        sock.curve_secretkey = sec.secret
        sock.curve_publickey = sec.public
        sock.curve_server = True


def secure_connect(sock: zmq.Socket, addr: str, sec: Security | None) -> None:
    """Make `sock` a CURVE client of a tcp peer holding the deployment's keys."""
    if addr.startswith("tcp://") and sec is not None and sec.curve:
        sock.curve_secretkey = sec.secret
        sock.curve_publickey = sec.public
        sock.curve_serverkey = sec.public


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
    `handler(frame)`. The handler runs in the receiver's thread and must be quick."""

    def __init__(self, ctx: zmq.Context, addr: str, handler: Callable[[bytes], None],
                 name: str = "receiver", security: Security | None = None):
        self._sock = ctx.socket(zmq.PULL)
        bound_receive(self._sock)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            secure_bind(self._sock, check_address(addr), security)
            self._sock.bind(bind_form(addr))
        except BaseException:
            self._sock.close(0)
            raise
        self._handler = handler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        sock = self._sock
        try:
            while not self._stop.is_set():
                if not sock.poll(POLL_MS):
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
            sock.close()

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
