"""Security of tcp sockets between hosts: ZeroMQ CURVE keys, the ZAP handler that admits only
the deployment's own key, and the refusal of a plain tcp bind open to the network.

TCP between hosts is authenticated and encrypted with ZeroMQ CURVE when a key folder is
given (`Security`, keys from `tokenrouter keygen`, `generate_keys`): every tcp PULL socket is
a CURVE server that admits only clients holding the deployment's key pair (checked by a ZAP
handler in each process, one per ZeroMQ context), every PUSH a CURVE client. Without keys a
tcp socket may bind only to a loopback address, unless the operator opts in
(`insecure=True`, `--insecure-tcp`). inproc and ipc (one host, file permissions) are
unaffected. `sockets.Receiver` and `sockets.Sender` call `secure_bind` and `secure_connect`.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass

import zmq
import zmq.auth
import zmq.auth.thread

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
