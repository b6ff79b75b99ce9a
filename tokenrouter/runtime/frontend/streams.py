"""What the frontend holds of each request in flight, and what it yields to its consumer.

Tokens of one request are committed by different subservers, and frames from different
senders are not ordered with respect to each other, so each request keeps a small reorder
buffer keyed by output position. It yields a `Delta` for every run of tokens that is in
order, and ends with a `Final` once the `done` report has arrived *and* every token
before it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tokenrouter.runtime.transport import wire


@dataclass
class Delta:
    """Tokens newly committed for a request, in order, and the writer of each."""

    tokens: list[int]
    writers: list[str] = field(default_factory=list)


@dataclass
class Final:
    reason: str  # stop | length | abort | error
    n_out: int
    written_by: dict[str, int]
    error: str | None = None


@dataclass
class RequestStream:
    rid: str
    blocks: int  # KV blocks reserved for it (admission control)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # Delta, then one Final
    buf: dict[int, tuple[int, str]] = field(default_factory=dict)  # position -> (token, writer)
    next: int = 0  # output position of the next token to yield
    done: wire.Done | None = None
    ended: bool = False

    def flush(self) -> Final | None:
        """Queue the tokens that are now in order; the request's `Final` once it is complete."""
        run, by = [], []
        while self.next in self.buf:
            tok, writer = self.buf.pop(self.next)
            run.append(tok)
            by.append(writer)
            self.next += 1
        if run:
            self.queue.put_nowait(Delta(run, by))
        d = self.done
        if d is not None and self.next >= d.n_out:
            return Final(d.reason, d.n_out, d.written_by, d.error)
        return None
