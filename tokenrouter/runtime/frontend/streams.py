"""What the frontend holds of each request in flight, and what it yields to its consumer.

Tokens of one request are committed by different subservers, and frames from different
senders are not ordered with respect to each other, so each request keeps a small reorder
buffer keyed by output position. It yields a `Delta` for every run of tokens that is in
order, and ends with a `Final` once the `done` report has arrived *and* every token
before it.

It also keeps what it has yielded, with the writer of each token and the writer of the
token after it (`Tokens` items say so): if a subserver's process dies, a request lost with
it is resumed from there, in the route state it had (`recovery.py`). A token at a position
already yielded is a repeat (a resumed request recomputes what was lost) and is ignored.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.transport import wire


@dataclass
class Delta:
    """Tokens newly committed for a request, in order, and the writer of each."""

    tokens: list[int]
    writers: list[str] = field(default_factory=list)


@dataclass
class Final:
    reason: str  # stop | length | abort | error | unavailable (the runtime gave up: HTTP 503)
    n_out: int
    written_by: dict[str, int]
    error: str | None = None


@dataclass
class RequestStream:
    rid: str
    blocks: int  # KV blocks reserved for it (admission control)
    prompt: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)
    route_seed: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # Delta, then one Final
    buf: dict[int, tuple[int, str, str]] = field(default_factory=dict)  # position -> (token, writer, next writer)
    next: int = 0  # output position of the next token to yield
    out: list[int] = field(default_factory=list)  # the tokens yielded so far
    writers: list[str] = field(default_factory=list)  # the writer of each
    nexts: list[str] = field(default_factory=list)  # the writer of the token after each
    done: wire.Done | None = None
    ended: bool = False

    def add(self, pos: int, token: int, writer: str, nxt: str) -> None:
        """A committed token; one at a position already yielded is a repeat and ignored."""
        if pos >= self.next:
            self.buf[pos] = (token, writer, nxt)

    def flush(self) -> Final | None:
        """Queue the tokens that are now in order; the request's `Final` once it is complete."""
        run, by = [], []
        while self.next in self.buf:
            tok, writer, nxt = self.buf.pop(self.next)
            run.append(tok)
            by.append(writer)
            self.nexts.append(nxt)
            self.next += 1
        if run:
            self.out += run
            self.writers += by
            self.queue.put_nowait(Delta(run, by))
        d = self.done
        if d is not None and self.next >= d.n_out:
            return Final(d.reason, d.n_out, d.written_by, d.error)
        return None
