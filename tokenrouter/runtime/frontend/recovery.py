"""Requests survive a subserver's death: find those lost with it and resume them.

When a subserver's process dies (or is declared dead: `liveness.py`), the requests it was
stepping, the handoffs on their way to it and from it, and the tokens it committed that the
frontend had not yet received are gone. Everything else is not: the frontend holds every
request's committed tokens (it streams them, `streams.py`), and the other subservers hold
theirs. A request is failed only when restarts are exhausted (or its deadline passes).

A *round* for a dead incarnation `inc` of writer W:

1. every other subserver that is up gets `peer_down(W, inc)`: from then on it drops what
   that incarnation still sends, forgets what W had read of each request (the next handoff
   to W's successor carries the whole context and is counted there as a re-prefill), parks
   departures to W until W is up again (`peers`), and answers with a *census* of the
   requests it holds: how many handoffs each has made (`hops`), whether it steps here
   (`active`, parked ones included), went away (`pending`, to `dest`) or ended here, and the
   output tokens the frontend lacks (`tail`: tokens W committed whose frames died with it);
2. with every census in, each request in flight is placed by its entry with the most hops
   (ties: active, then ended, then pending). Active or ended at a survivor, or pending on its
   way to another live writer: it goes on untouched. Pending on its way to W, or held by
   nobody (it only ever was at W, or its submit died with W), it was lost: it is *resumed*;
3. a resume gives the request, as the frontend holds it, to the writer of its next token
   (`resume`): all its tokens, the route state they imply (the writer of the next token,
   the tokens written in the current visit, who wrote how many), one more hop than any copy
   seen. Sent now if that writer is up, else when it reports ready again. The receiver
   prefills it (or extends what it kept of it), so greedy tokens are the reference's;
   tokens recomputed at positions the frontend already yielded are repeats and ignored.

The route state at the frontend's last token: each `tokens` item names the writer of the
token after it, so the next writer is known; the visit's count is the run of tokens that
writer wrote while staying. One case is the census's: a request whose copy at a survivor
departed (rewriting its own token) with no token since is resumed in that copy's state
(visit 0 at its `dest`), since a writer cannot step again a request whose tokens its KV
already holds. A request that reached a stop already ends here, without a resume.

`Recovery` does this for the `Frontend`, which owns it and gives it what it needs as
callables; it keeps the rounds in progress and its own record of each resume (a request
resumed once and lost again before it arrived is resumed again, never twice at once).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable

from tokenrouter.protocol.sampling import end_reason
from tokenrouter.protocol.state import PeerMessage
from tokenrouter.runtime.frontend.streams import Final, RequestStream
from tokenrouter.runtime.logs import about
from tokenrouter.runtime.transport import wire

log = logging.getLogger(__name__)

_RANK = {"active": 3, "ended": 2, "pending": 1}


@dataclass
class Round:
    id: int
    writer: str  # the dead writer
    inc: int  # its dead incarnation
    asked: set[str]
    have: dict[str, int]  # the output tokens the frontend held of each request when it asked
    entries: dict[str, list[wire.CensusEntry]] = field(default_factory=lambda: collections.defaultdict(list))


@dataclass
class RouteAt:
    """A request's route state after its first `n` output tokens."""

    writer: str
    visit_tokens: int


@dataclass
class Resumed:
    """The frontend's own copy of a resumed request: its hops, and the route state it goes
    on in (`at.writer` is where it goes)."""

    hops: int
    at: RouteAt
    sent_to: int = 0  # the writer's incarnation it was sent to; 0 while it waits for one


def route_at(live: RequestStream, start_writer: str) -> RouteAt:
    """The route state after the tokens the frontend has yielded (module docstring)."""
    if not live.out:
        return RouteAt(start_writer, 0)
    writer = live.nexts[-1]
    visit = 0
    for by, nxt in zip(reversed(live.writers), reversed(live.nexts)):
        if by != writer or nxt != writer:
            break
        visit += 1
    return RouteAt(writer, visit)


def finished_at(live: RequestStream, max_model_len: int) -> str | None:
    """Why a request is complete with the tokens it has ("stop" / "length"), if it is: the
    end-of-request rule (`protocol/sampling.end_reason`) at its last token."""
    return end_reason(live.out[-1] if live.out else None, len(live.out), len(live.prompt) + len(live.out),
                      live.params, max_model_len)


class Recovery:
    """Rounds of census and resumes, for the `Frontend`, which gives it:

    reqs                  its requests in flight, by id (read; tokens are added to them)
    send(writer, msg)     send a message to a subserver (queued at once)
    incarnation(writer)   the writer's current incarnation, 0 while it is down
    flush(live)           put a request's tokens in order, ending it if complete
    end(live, final)      end a request
    max_model_len()       the context length
    """

    def __init__(self, start_writer: str, writers: list[str], reqs: dict[str, RequestStream],
                 send: Callable[[str, object], None], incarnation: Callable[[str], int],
                 flush: Callable[[RequestStream], None], end: Callable[[RequestStream, Final], None],
                 max_model_len: Callable[[], int]):
        self.start_writer, self.writers, self.reqs = start_writer, list(writers), reqs
        self.send, self.incarnation, self.flush, self.end = send, incarnation, flush, end
        self.max_model_len = max_model_len
        self.rounds: dict[int, Round] = {}
        self.records: dict[str, Resumed] = {}
        self.resumed: dict[str, int] = {}  # resumes sent, by target writer
        self.lost_tokens = 0  # tokens the dead took with them, refilled from a census
        self._ids = 0

    @property
    def busy(self) -> bool:
        """A round is waiting for censuses, or a resume for its writer to come up."""
        return bool(self.rounds) or any(not r.sent_to for r in self.records.values())

    # ------------------------------------------------------------------ rounds
    def start_round(self, writer: str, inc: int) -> None:
        """`writer`'s incarnation `inc` is dead: ask every survivor what it holds."""
        self._ids += 1
        have = {rid: live.next for rid, live in self.reqs.items() if not live.ended}
        asked = {w for w in self.writers if w != writer and self.incarnation(w)}
        rnd = Round(self._ids, writer, inc, asked, have)
        self.rounds[rnd.id] = rnd
        for w in asked:
            self.send(w, wire.PeerDown(to=self.incarnation(w), round=rnd.id, writer=writer, inc=inc, have=have))
        log.warning("subserver %s (incarnation %x) died: asking %s what they hold of %d requests",
                    writer, inc, ", ".join(sorted(asked)) or "nobody", len(have), extra=about(writer))
        self._maybe_decide(rnd)

    def on_census(self, msg: wire.Census) -> None:
        rnd = self.rounds.get(msg.round)
        if rnd is None or msg.writer not in rnd.asked:
            return
        rnd.asked.discard(msg.writer)
        for e in msg.entries:
            rnd.entries[e.rid].append(e)
            self._refill(rnd, e)
        self._maybe_decide(rnd)

    def went_down(self, writer: str) -> None:
        """`writer` went down too: no census will come from it (its own round follows)."""
        for rnd in list(self.rounds.values()):
            if writer in rnd.asked:
                rnd.asked.discard(writer)
                self._maybe_decide(rnd)

    def came_up(self, writer: str) -> None:
        """`writer` is up (a new incarnation): send the resumes waiting for it."""
        for rid, rec in list(self.records.items()):
            if rec.at.writer == writer and not rec.sent_to:
                live = self.reqs.get(rid)
                if live is None or live.ended:
                    del self.records[rid]
                else:
                    self._send_resume(live, rec)

    def forget(self, rid: str) -> None:
        """The request ended."""
        self.records.pop(rid, None)

    # --------------------------------------------------------------- internals
    def _refill(self, rnd: Round, e: wire.CensusEntry) -> None:
        """Output tokens a survivor holds that the frontend never received. Every live
        sender's frames sent before its census have arrived, so these died with the dead
        writer's frames: it wrote them (a token a live writer committed after its own census
        may be taken for one; its values are the same, only its writer label differs)."""
        live = self.reqs.get(e.rid)
        if live is None or live.ended or not e.tail:
            return
        first = rnd.have.get(e.rid, live.next)
        added = 0
        for i, tok in enumerate(e.tail):
            pos = first + i
            if pos >= live.next and pos not in live.buf:
                after = live.buf.get(pos + 1)  # the writer of the token after it, where known
                nxt = rnd.writer if i < len(e.tail) - 1 else (after[1] if after else e.dest)
                live.add(pos, tok, rnd.writer, nxt)
                added += 1
        if added:
            self.lost_tokens += added
            self.flush(live)

    def _maybe_decide(self, rnd: Round) -> None:
        if rnd.asked:
            return
        del self.rounds[rnd.id]
        # only what was in flight when it died (nothing new is admitted while a round is open)
        lost = [self.reqs[rid] for rid in rnd.have
                if rid in self.reqs and not self.reqs[rid].ended and self._lost(rnd, rid)]
        for live in lost:
            self._resume(rnd, live)
        log.warning("subserver %s died: %d requests resumed, %d went on untouched", rnd.writer, len(lost),
                    sum(1 for live in self.reqs.values() if not live.ended) - len(lost), extra=about(rnd.writer))

    def _top(self, rnd: Round, rid: str) -> wire.CensusEntry | None:
        entries = rnd.entries.get(rid, [])
        return max(entries, key=lambda e: (e.hops, _RANK[e.status]), default=None)

    def _lost(self, rnd: Round, rid: str) -> bool:
        top, rec = self._top(rnd, rid), self.records.get(rid)
        if rec is not None and (top is None or rec.hops > top.hops):
            # the frontend's own resume is the latest copy: lost only if it went to the dead
            return rec.at.writer == rnd.writer and rec.sent_to == rnd.inc
        if top is None:
            return True  # it only ever was at the dead writer (or its submit died there)
        return top.status == "pending" and top.dest == rnd.writer

    def _resume(self, rnd: Round, live: RequestStream) -> None:
        why = finished_at(live, self.max_model_len())
        if why is not None:  # its last tokens reached us, its `done` did not
            self.end(live, Final(why, len(live.out), dict(collections.Counter(live.writers))))
            return
        top = self._top(rnd, live.rid)
        at = route_at(live, self.start_writer)
        if top is not None and top.status == "pending" and top.n_out == len(live.out):
            at = RouteAt(top.dest, 0)  # it departed rewriting its token: resume it at its dest
        live.buf.clear()  # what is past the last token in order is recomputed
        rec = self.records.get(live.rid)
        # one hop more than any live copy (with no copy seen, no live subserver holds one)
        hops = 1 + max(top.hops if top else 0, rec.hops if rec else 0)
        self.records[live.rid] = rec = Resumed(hops, at)
        if self.incarnation(at.writer):
            self._send_resume(live, rec)

    def _send_resume(self, live: RequestStream, rec: Resumed) -> None:
        """Everything the frontend holds of the request, in its route state, to its writer."""
        at = rec.at
        msg = PeerMessage(rid=live.rid, suffix=list(live.prompt) + list(live.out), start=0,
                          prompt_len=len(live.prompt), writer=at.writer, visit_tokens=at.visit_tokens,
                          route_seed=live.route_seed, written_by=dict(collections.Counter(live.writers)),
                          sampling=live.params, hops=rec.hops)
        rec.sent_to = self.incarnation(at.writer)
        self.send(at.writer, wire.Resume(to=rec.sent_to, msg=msg))
        self.resumed[at.writer] = self.resumed.get(at.writer, 0) + 1
