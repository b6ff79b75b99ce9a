"""What bounds HTTP connections below the app: how long a client may take to send its
headers and its body, how long a connection may stay idle, and how many may be open.

uvicorn's own HTTP/1.1 protocol closes an idle keep-alive connection after a response, but
not a connection that never sends a request, nor one that sends its headers or body a byte
at a time: such clients, each holding a file descriptor, can exhaust the process's
descriptors, and then no request is served. `guarded_protocol` subclasses it:

- *header timeout*: from the moment a connection opens (or a response on it completes)
  until a request's headers are complete; then the connection is closed;
- *body timeout*: from the headers until the body is complete;
- *idle timeout*: uvicorn's keep-alive between requests (the header timeout also bounds it);
- *connection cap*: at `max_connections` open, a new connection takes the place of the
  oldest one that has not sent a complete request yet (idle or slow), or, when every open
  connection has a request running, is answered 503 with `Retry-After` and closed at once.

A request's running time is not bounded here (a long stream is fine): that is the
request deadline's (`Limits.request_timeout_s`). `ConnectionStats` counts what was closed
and why, for /metrics. `server_config` makes the uvicorn `Config` with these limits, and
`raise_descriptor_limit` lifts the process's soft descriptor limit to its hard one so the
cap, not the operating system, is what binds.
"""

from __future__ import annotations

import asyncio
import collections
import resource
from dataclasses import dataclass, field

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ConnectionLimits", "ConnectionStats", "guarded_protocol", "raise_descriptor_limit", "server_config"]

DESCRIPTORS_KEPT = 256  # descriptors left to the rest of the process (sockets to subservers, files)
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
           b"connection: close\r\ncontent-length: 118\r\n\r\n"
           b'{"error": {"message": "too many open connections; retry later", "type": "server_error", '
           b'"param": null, "code": null}}')


@dataclass
class ConnectionLimits:
    """How long a client may take, and how many connections may be open (`tokenrouter serve`
    flags `--header-timeout`, `--body-timeout`, `--idle-timeout`, `--max-connections`)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0
    max_connections: int = 4096


@dataclass
class ConnectionStats:
    open: int = 0
    accepted: int = 0
    closed: dict[str, int] = field(default_factory=dict)  # header_timeout | body_timeout | evicted | refused

    def count(self, why: str) -> None:
        self.closed[why] = self.closed.get(why, 0) + 1


def raise_descriptor_limit() -> int:
    """Lift the soft limit on open descriptors to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(wanted: int) -> int:
    """`wanted`, or fewer where the descriptor limit would bind first."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - DESCRIPTORS_KEPT))


def guarded_protocol(limits: ConnectionLimits, stats: ConnectionStats) -> type:
    """uvicorn's h11 protocol with the header and body timeouts and the connection cap."""
    cap = connection_cap(limits.max_connections)
    timeouts = {"headers": limits.header_timeout_s, "body": limits.body_timeout_s}
    waiting: collections.OrderedDict = collections.OrderedDict()  # connections without a request, oldest first

    class Guarded(H11Protocol):
        def connection_made(self, transport) -> None:
            self._phase: str | None = None
            self._timer: asyncio.TimerHandle | None = None
            stats.accepted += 1
            if len(self.connections) >= cap and not self._evict_one():
                stats.count("refused")
                transport.write(REFUSED)
                transport.close()
                self.transport = transport
                return
            super().connection_made(transport)
            stats.open = len(self.connections)
            self._watch()

        def connection_lost(self, exc) -> None:
            self._arm(None)
            waiting.pop(self, None)
            if self.flow is None:  # refused: uvicorn never saw it
                return
            super().connection_lost(exc)
            stats.open = len(self.connections)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        # ---------------------------------------------------------------- guard
        def _evict_one(self) -> bool:
            """Close the connection that has waited longest without a complete request."""
            if not waiting:
                return False
            oldest, _ = waiting.popitem(last=False)
            stats.count("evicted")
            oldest._arm(None)
            oldest.transport.close()
            self.connections.discard(oldest)
            return True

        def _watch(self) -> None:
            """Arm the timer of what the connection waits for from its client; keep the
            connections that wait for a request's headers in the order they began to."""
            st = self.conn.their_state
            phase = "headers" if st is h11.IDLE else "body" if st is h11.SEND_BODY else None
            if phase == "headers" and self._phase != "headers":
                waiting[self] = None
            elif phase != "headers":
                waiting.pop(self, None)
            self._arm(phase)

        def _arm(self, phase: str | None) -> None:
            if phase == self._phase:
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._phase = phase
            if phase is not None:
                self._timer = self.loop.call_later(timeouts[phase], self._expired, phase)

        def _expired(self, phase: str) -> None:
            self._timer = None
            if self._phase == phase and not self.transport.is_closing():
                stats.count(f"{'header' if phase == 'headers' else 'body'}_timeout")
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = "GuardedH11Protocol"
    return Guarded


def server_config(app, host: str, port: int, log_level: str, limits: ConnectionLimits,
                  stats: ConnectionStats) -> uvicorn.Config:
    """uvicorn's `Config` for the app, on the guarded protocol."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          http=guarded_protocol(limits, stats), timeout_keep_alive=limits.idle_timeout_s)
