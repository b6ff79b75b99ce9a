"""Security of tcp sockets: ZeroMQ CURVE keys, the ZAP handler that admits only the
deployment's own key, the count of connections refused at the handshake, and the refusal of
plain tcp.

Every tcp socket is authenticated and encrypted with ZeroMQ CURVE (`Security`): every tcp
PULL socket is a CURVE server that admits only clients holding the deployment's key pair
(checked by a ZAP handler in each process, one per ZeroMQ context), every PUSH a CURVE
client. The keys come from a folder (`tokenrouter keygen`, `generate_keys`: a deployment
across hosts), or, when every subserver is started by this launch, are made for it in
memory (`Security.for_launch`) and handed to the subserver processes through the spawn
pipe: a user needs no `keygen` for one host, and no other process, even on loopback, can
send a frame. Plain tcp is refused unless the operator opts in (`insecure=True`,
`--insecure-tcp`: a network where every process is trusted). A peer that fails the
handshake (plain, or other keys) never delivers a frame; `watch_handshakes` counts it.
inproc (one process) and ipc (a socket file in a folder only its user can enter) need no
keys. `sockets.Receiver` and `sockets.Sender` call `secure_bind` and `secure_connect`.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass

import zmq
import zmq.auth
import zmq.auth.thread
import zmq.utils.monitor

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
    insecure: bool = False  # no keys, and plain tcp allowed
    launch_pair: tuple[str, str] | None = None  # keys made for this launch (public, secret; z85 text)

    @classmethod
    def load(cls, folder: str | None, insecure: bool = False, pair: tuple[str, str] | None = None) -> "Security":
        """The keys in `folder`, or those of `pair` (made by a launch), or none."""
        if folder is None and pair is not None:
            return cls(public=pair[0].encode(), secret=pair[1].encode(), launch_pair=tuple(pair))
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

    @classmethod
    def for_launch(cls, folder: str | None, insecure: bool, addresses: dict[str, str],
                   remote: tuple[str, ...] = ()) -> "Security":
        """A launch's security: the folder's keys; else, where some address is tcp, a key
        pair made now (every process of the deployment is started here, so it can be handed
        to them); plain with `insecure`. A writer started elsewhere (`remote`) over tcp cannot
        get keys made here: it needs a folder, or `insecure`."""
        if folder is not None or insecure or not any(a.startswith("tcp://") for a in addresses.values()):
            return cls.load(folder, insecure)
        if remote:
            raise SecurityError(f"tcp to a subserver started elsewhere ({', '.join(remote)}) needs the deployment's "
                                f"CURVE keys: give --curve-keys DIR (`tokenrouter keygen DIR`) on every host, "
                                f"or --insecure-tcp on a network you trust")
        public, secret = zmq.curve_keypair()
        return cls(public=public, secret=secret, launch_pair=(public.decode(), secret.decode()))

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
    """Refuse a plain tcp bind unless the operator opted in."""
    sec = sec or Security()
    if addr.startswith("tcp://") and not sec.curve and not sec.insecure:
        who = "every process on this host" if _is_tcp_loopback(addr) else "anyone on the network"
        raise SecurityError(f"binding {addr} without CURVE keys would let {who} send this process commands: "
                            f"give --curve-keys DIR (`tokenrouter keygen DIR`), or --insecure-tcp where every "
                            f"process that can reach the port is trusted")


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


#: Monitor events of a peer that failed the handshake (plain against CURVE, other keys, garbage).
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def watch_handshakes(sock: zmq.Socket, addr: str, sec: Security | None):
    """A monitor socket that reports every peer refused at the handshake of a CURVE tcp
    socket (read it with `refused`), or None where there is no handshake to fail."""
    if not addr.startswith("tcp://") or sec is None or not sec.curve:
        return None
    return sock.get_monitor_socket(events=HANDSHAKE_FAILED)


def refused(event_frames: list[bytes]) -> bool:
    """Whether a monitor message (its frames) is a refused handshake."""
    return bool(zmq.utils.monitor.parse_monitor_message(event_frames)["event"] & HANDSHAKE_FAILED)


def secure_connect(sock: zmq.Socket, addr: str, sec: Security | None) -> None:
    """Make `sock` a CURVE client of a tcp peer holding the deployment's keys."""
    if addr.startswith("tcp://") and sec is not None and sec.curve:
        sock.curve_secretkey = sec.secret
        sock.curve_publickey = sec.public
        sock.curve_serverkey = sec.public
