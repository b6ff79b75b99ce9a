"""The frontend's view of the runtime: submit requests, stream their tokens, abort them.

It lives in one asyncio event loop (uvicorn's for `serve`, a private one for the offline
API) and owns the frontend's ZeroMQ sockets (`endpoint.py`: a PULL socket where subservers
report, read by the receive loop, and a PUSH socket to every subserver); the receive loop
hands every message it decodes to `Frontend._on_message`.

Each request in flight is a `RequestStream` (`streams.py`), which puts the tokens of
several subservers back in order, keeps what it yielded and, given the tokenizer,
detokenises them and matches the request's stop strings (`text.py`). When it ends (done, a
stop string, abort, error) the frontend tells every subserver to release it (free its KV):
the same message for every ending, so invariant 3 has one code path. Its latency and token
counts go to `metrics` (`metrics.RequestMetrics`).

A request gets its route seed (the seed of the program's coin flips,
`protocol.state.route_seed_of`) from its caller, or from its request id when it gives none.

The frontend is composed of the parts it owns: `endpoint` (`endpoint.py`: the sockets and
the receive loop, which no frame stops), `admission` (`admission.py`, KV admission
control: a request reserves its blocks before it is submitted and waits while they are
not free), `watch` (`liveness.py`: heartbeats, incarnations, restarts), `recovery`
(`recovery.py`: the requests a dead subserver held are found and resumed, none fails) and
`control` (`control.py`: `ready` messages, at start-up and after a restart, the peers'
incarnations, frames from a process that is not its writer's live incarnation).
Starting the subservers and a connected frontend is `launch.open_runtime`.

A message only a subserver takes is dropped and counted as `invalid`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any, AsyncIterator, Callable

import zmq

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import route_seed_of
from tokenrouter.runtime.frontend.admission import KvAdmission, blocks_needed
from tokenrouter.runtime.frontend.control import ControlPlane, RuntimeUnavailable
from tokenrouter.runtime.frontend.endpoint import Endpoint
from tokenrouter.runtime.frontend.liveness import HEARTBEAT_TIMEOUT_S, MAX_RESTARTS, STALL_WINDOW_S, Watch
from tokenrouter.runtime.frontend.recovery import Recovery
from tokenrouter.runtime.frontend.streams import Delta, Final, RequestStream
from tokenrouter.runtime.frontend.text import TextStream
from tokenrouter.runtime.metrics import RequestMetrics
from tokenrouter.runtime.transport import wire

__all__ = ["Delta", "Final", "Frontend", "RuntimeUnavailable"]

FRONTEND = wire.FRONTEND


class Frontend:
    def __init__(self, start_writer: str, addresses: dict[str, str], ctx: zmq.Context | None = None,
                 alive: Callable[[], dict[str, bool]] | None = None,
                 restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, stall_window_s: float = STALL_WINDOW_S,
                 max_restarts: int = MAX_RESTARTS, on_fatal: Callable[[str], None] | None = None, security=None,
                 pids: Callable[[], dict[str, int]] | None = None):
        self.start_writer = start_writer
        self.addresses = addresses
        self.writers = [n for n in addresses if n != FRONTEND]
        self.endpoint = Endpoint(addresses, self.writers, self._on_message, ctx, security)
        self.admission = KvAdmission(lambda: self.healthy)
        self.reqs: dict[str, RequestStream] = {}
        self.watch = Watch(self.writers, end_all=self._fail_all, lost=self._lost, release=self._release_at,
                           wake=self.admission.wake, drained=self.endpoint.drained, alive=alive, restart=restart,
                           heartbeat_timeout_s=heartbeat_timeout_s, stall_window_s=stall_window_s,
                           max_restarts=max_restarts, on_fatal=on_fatal)
        self.recovery = Recovery(start_writer, self.writers, self.reqs, send=self.endpoint.post,
                                 incarnation=self._inc, flush=self._flush, end=self._end,
                                 max_model_len=lambda: self.max_model_len)
        self.control = ControlPlane(self.writers, self.watch, self.recovery, self.reqs, post=self.endpoint.post,
                                    inc=self._inc, drop=self.endpoint.drop, pids=pids)
        self.metrics = RequestMetrics()
        self.finished: dict[str, int] = {}
        self._closed = False
        self._stats_ids = itertools.count(1)
        self._stats_waiters: dict[int, tuple[asyncio.Future, dict[str, Any], set[str]]] = {}
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life
    @property
    def healthy(self) -> bool:
        """A request can complete now: every subserver is up and no recovery is under way."""
        return (self.control.started and not self._closed and self.watch.fatal is None and self.watch.all_up
                and not self.recovery.busy)

    @property
    def failure(self) -> str | None:
        """Why the runtime cannot take requests now (None when it can)."""
        if self.watch.fatal:
            return self.watch.fatal
        if self.control.start_failure:
            return self.control.start_failure
        down = "; ".join(self.watch.down())
        if not down and self.control.started and self.recovery.busy:
            return "recovering the requests of a subserver that died"
        return down or None

    def health(self) -> dict[str, dict[str, Any]]:
        return self.watch.health()

    async def start(self, timeout: float = 120.0) -> None:
        """Bind, connect, and wait until every subserver reported ready."""
        self._tasks += self.endpoint.open()
        await self.control.wait_ready(timeout)
        self.admission.capacity = min(r.blocks_total for r in self.control.ready.values())
        self.control.tell_peers()
        self.control.started = True
        self._tasks.append(self.watch.start())

    async def close(self, shutdown: bool = True) -> None:
        if shutdown:
            for w in self.writers:
                if self._inc(w):
                    self.endpoint.post(w, wire.Shutdown(to=self._inc(w)))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.endpoint.close()
        self._closed = True

    @property
    def block_size(self) -> int:
        return max(r.block_size for r in self.control.ready.values())

    @property
    def max_model_len(self) -> int:
        return min(r.max_model_len for r in self.control.ready.values())

    @property
    def vocab_size(self) -> int:
        return min(r.vocab_size for r in self.control.ready.values())

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        """The KV blocks a request reserves (`admission.blocks_needed`)."""
        return blocks_needed(prompt_len, max_tokens, self.block_size)

    @property
    def capacity_blocks(self) -> int:
        return self.admission.capacity

    # -------------------------------------------------------------- requests
    async def generate(self, prompt: list[int], params: SamplingParams, route_seed: int | None = None,
                       rid: str | None = None, tokenizer=None,
                       skip_special_tokens: bool = True, fork_of: str | None = None) -> AsyncIterator[Delta | Final]:
        """Submit one request and yield its tokens as they are committed, then a `Final`.
        `route_seed` seeds the program's coin flips; None takes `route_seed_of(rid)`.
        With a `tokenizer`, every event carries its text and the request's stop strings end
        it (without one, stop strings are refused). A `Delta` that arrives with the request's
        end carries its `Final` too. Closing the iterator early (a client went away) aborts
        the request. `fork_of`: the id of a request submitted before with the same prompt
        (choice 0 of `n` > 1), whose prompt KV the start writer may fork for this one."""
        if not self.healthy:
            raise RuntimeUnavailable(self.failure or "the runtime is not running")
        if params.stop and tokenizer is None:
            raise ValueError("stop strings need the tokenizer (Frontend.generate(tokenizer=...))")
        rid = rid or uuid.uuid4().hex
        if route_seed is None:
            route_seed = route_seed_of(rid)
        blocks = self.blocks_needed(len(prompt), params.max_tokens)
        if blocks > self.admission.capacity:
            raise ValueError(f"the request needs {blocks} KV blocks, more than the {self.admission.capacity} "
                             f"there are")
        text = None if tokenizer is None else TextStream(
            tokenizer, params.stop, params.stop_token_ids, params.include_stop_str_in_output, skip_special_tokens)
        live = RequestStream(rid, blocks, text, prompt=list(prompt), params=params, route_seed=route_seed)
        finished = False
        try:
            if not await self.admission.reserve(blocks):
                raise RuntimeUnavailable(self.failure or "the runtime stopped")
            if not self.healthy:  # it went down while this one waited for its blocks
                await self.admission.release(blocks)
                raise RuntimeUnavailable(self.failure or "the runtime stopped")
            # registered and sent in one step of the event loop: a recovery round sees it
            # either with its submit already on the way, or not at all
            live.submitted = time.monotonic()
            self.reqs[rid] = live
            for w in self.writers:
                if w == self.start_writer:
                    self.endpoint.post(w, wire.Submit(to=self._inc(w), rid=rid, prompt=list(prompt),
                                                      sampling=params, route_seed=route_seed, fork_of=fork_of))
                else:
                    self.endpoint.post(w, wire.Announce(to=self._inc(w), rid=rid))
            while True:
                ev = self._merged(await live.queue.get(), live.queue)
                if isinstance(ev, Final):
                    finished = True
                    yield ev
                    return
                yield ev
                if ev.final is not None:
                    finished = True
                    yield ev.final
                    return
        finally:
            if not finished:
                self.abort(rid)

    @staticmethod
    def _merged(ev: Delta | Final, queue: asyncio.Queue) -> Delta | Final:
        """`ev` with the events already queued behind it: runs of tokens joined, and the
        `Final` attached when it is there (so the last chunk of a stream carries both)."""
        while isinstance(ev, Delta) and ev.final is None and not queue.empty():
            nxt = queue.get_nowait()
            if isinstance(nxt, Final):
                ev.final = nxt
            else:
                ev = Delta(ev.tokens + nxt.tokens, ev.writers + nxt.writers, ev.logprobs + nxt.logprobs,
                           ev.text + nxt.text, nxt.final)
        return ev

    def abort(self, rid: str) -> None:
        """End a request now (its client went away); synchronous, so it also works in a
        cancelled task. Unknown or ended requests are ignored."""
        live = self.reqs.get(rid)
        if live is None or live.ended:
            return
        self._end(live, Final("abort", live.next, {}, None))

    async def configure(self, writer: str, batch_threshold: int | None = None,
                        max_wait_ms: float | None = None) -> None:
        """Change a subserver's delayed batching at run time (again after a restart)."""
        given = {k: v for k, v in (("batch_threshold", batch_threshold), ("max_wait_ms", max_wait_ms)) if v is not None}
        self.control.configure(writer, given)

    async def debug_fail(self, writer: str, count: int = 1) -> None:
        self.endpoint.post(writer, wire.DebugFail(to=self._inc(writer), count=count))

    async def debug_hold(self, writer: str, seconds: float, busy: bool) -> None:
        self.endpoint.post(writer, wire.DebugHold(to=self._inc(writer), seconds=seconds, busy=busy))

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """A snapshot of every subserver's counters (those that answer in time)."""
        sid = next(self._stats_ids)
        fut = asyncio.get_running_loop().create_future()
        got: dict[str, Any] = {}
        asked = [w for w in self.writers if self._inc(w)]  # a down subserver cannot answer
        if not asked:
            return {}
        self._stats_waiters[sid] = (fut, got, set(asked))
        for w in asked:
            self.endpoint.post(w, wire.Stats(to=self._inc(w), id=sid))
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._stats_waiters.pop(sid, None)
        return dict(got)

    def frontend_stats(self) -> dict[str, Any]:
        return {"finished": dict(self.finished), "running": sum(1 for r in self.reqs.values() if not r.ended),
                "queued": self.admission.queued, "writers": list(self.writers),
                "up": {w: lv.up for w, lv in self.watch.live.items()},
                "restarts": {w: lv.restarts for w, lv in self.watch.live.items()}, "gaps": self.watch.gaps(),
                "resumed": dict(self.recovery.resumed), "lost_tokens_refilled": self.recovery.lost_tokens,
                "frames_dropped": dict(self.endpoint.frames_dropped), "loop_restarts": self.endpoint.loop_restarts,
                "prompt_tokens": self.metrics.prompt_tokens, "generation_tokens": self.metrics.generation_tokens}

    # --------------------------------------------------------------- internals
    def _inc(self, writer: str) -> int:
        """`writer`'s live incarnation (0 while it is down)."""
        return self.watch.live[writer].inc

    def _end(self, live: RequestStream, final: Final) -> None:
        """Finish a request once: tell its consumer, release it everywhere, free its reservation."""
        if live.ended:
            return
        live.ended = True
        live.queue.put_nowait(final)
        self.finished[final.reason] = self.finished.get(final.reason, 0) + 1
        self.reqs.pop(live.rid, None)
        self.recovery.forget(live.rid)
        self.metrics.observe(live.arrived, live.submitted, live.token_times, time.monotonic(),
                             live.prompt_len, live.next)
        self.watch.remember_ended(live.rid)
        asyncio.get_running_loop().create_task(self._release(live, final.reason))

    def _fail_all(self, message: str) -> int:
        """End every request in flight: the runtime gave up (the watch's `end_all`); how many."""
        ended = list(self.reqs.values())
        for live in ended:
            self._end(live, Final("unavailable", live.next, {}, message))
        return len(ended)

    def _lost(self, writer: str, inc: int) -> None:
        """Incarnation `inc` of `writer` died (the watch's `lost`): recover its requests."""
        self.recovery.went_down(writer)
        self.recovery.start_round(writer, inc)

    async def _release(self, live: RequestStream, reason: str) -> None:
        for w in self.writers:
            if self._inc(w):  # a down one is released when it is back (`Watch.remember_ended`)
                try:
                    self.endpoint.post(w, wire.Release(to=self._inc(w), rid=live.rid, reason=reason))
                except zmq.ZMQError:
                    pass
        await self.admission.release(live.blocks)

    async def _release_at(self, writer: str, rid: str) -> None:
        """Release an ended request again at a subserver that came back (the watch's `release`)."""
        if self._inc(writer):
            self.endpoint.post(writer, wire.Release(to=self._inc(writer), rid=rid, reason="error"))

    def _on_message(self, msg) -> None:
        if isinstance(msg, wire.Ready):
            self.control.on_ready(msg)
            return
        if not isinstance(msg, (*wire.FROM_SUBSERVER, wire.Handoff)):
            self.endpoint.drop("invalid")  # a message only a subserver takes
            return
        w = msg.sender if isinstance(msg, wire.Handoff) else msg.writer
        if not self.watch.accepts(w, msg.inc):
            self.control.refuse(w, msg.inc)
            return
        self.watch.seen(w, msg)
        if isinstance(msg, wire.Tokens):
            for rid, pos, tok, nxt in msg.items:
                live = self.reqs.get(rid)
                if live is not None and not live.ended:
                    live.add(pos, tok, msg.writer, nxt, msg.logprobs.get(rid))
            for rid in {i[0] for i in msg.items}:
                live = self.reqs.get(rid)
                if live is not None and not live.ended:
                    self._flush(live)
        elif isinstance(msg, wire.Done):
            live = self.reqs.get(msg.rid)
            if live is None or live.ended:
                return
            if msg.reason == "error":
                self._end(live, Final("error", live.next, msg.written_by, msg.error))
                return
            live.done = msg
            self._flush(live)
        elif isinstance(msg, wire.Handoff):  # the `relay` transport
            self.endpoint.forward(msg)
        elif isinstance(msg, wire.Census):
            self.recovery.on_census(msg)
        elif isinstance(msg, wire.StatsReply):
            w = self._stats_waiters.get(msg.id)
            if w is not None:
                fut, got, asked = w
                got[msg.writer] = msg.stats
                if set(got) >= asked and not fut.done():
                    fut.set_result(None)

    def _flush(self, live: RequestStream) -> None:
        final = live.flush()
        if final is not None:
            self._end(live, final)
