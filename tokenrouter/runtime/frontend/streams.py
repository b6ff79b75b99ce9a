"""What the frontend holds of each request in flight, and what it yields to its consumer.

Tokens of one request are committed by different subservers, and frames from different
senders are not ordered with respect to each other, so each request keeps a small reorder
buffer keyed by output position. It yields a `Delta` for every run of tokens that is in
order, and ends with a `Final` once the `done` report has arrived *and* every token
before it, or as soon as a stop string matched in its text (`text.py`): the request is
then ended here, and released everywhere, as `stop`.

With a `TextStream` every `Delta` carries the text its tokens release and the `Final` the
rest; each token carries its writer and, when asked for, its log-probabilities.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tokenrouter.runtime.frontend.text import TextStream
from tokenrouter.runtime.transport import wire

#: (a token's log-probability, [(token id, log-probability)] of the top k)
Logprobs = tuple[float, list[tuple[int, float]]]


@dataclass
class Final:
    reason: str  # stop | length | abort | error
    n_out: int
    written_by: dict[str, int]
    error: str | None = None
    stop_reason: str | None = None  # the stop string that ended it
    text: str = ""  # the rest of the text (with a TextStream)


@dataclass
class Delta:
    """Tokens newly committed for a request, in order, the writer of each, their
    log-probabilities (None where not asked) and, with a TextStream, the text they release.
    `final` is set when the request ended with these tokens (its `Final` follows too)."""

    tokens: list[int]
    writers: list[str] = field(default_factory=list)
    logprobs: list[Logprobs | None] = field(default_factory=list)
    text: str = ""
    final: Final | None = None


@dataclass
class RequestStream:
    rid: str
    blocks: int  # KV blocks reserved for it (admission control)
    text: TextStream | None = None
    prompt_len: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # Delta, then one Final
    buf: dict[int, tuple[int, str, Logprobs | None]] = field(default_factory=dict)  # position -> token, writer, logprobs
    next: int = 0  # output position of the next token to yield
    done: wire.Done | None = None
    ended: bool = False
    written_by: dict[str, int] = field(default_factory=dict)  # of the tokens yielded
    arrived: float = field(default_factory=time.monotonic)
    submitted: float | None = None  # when its KV was reserved and it went to the start writer
    token_times: list[float] = field(default_factory=list)  # arrival of each yielded run (metrics)

    def flush(self) -> Final | None:
        """Queue the tokens that are now in order; the request's `Final` once it is complete."""
        run, by, lps, text = [], [], [], []
        final = None
        while self.next in self.buf:
            tok, writer, lp = self.buf.pop(self.next)
            run.append(tok)
            by.append(writer)
            lps.append(lp)
            self.next += 1
            self.written_by[writer] = self.written_by.get(writer, 0) + 1
            if self.text is not None:
                text.append(self.text.push(tok))
                if self.text.matched is not None:
                    final = Final("stop", self.next, dict(self.written_by), stop_reason=self.text.matched)
                    break
        d = self.done
        if final is None and d is not None and self.next >= d.n_out:
            rest = self.text.finish() if self.text is not None else ""
            final = Final(d.reason, d.n_out, d.written_by, d.error, text=rest)
        if run:
            self.token_times.append(time.monotonic())
            self.queue.put_nowait(Delta(run, by, lps, "".join(text), final))
        return final
