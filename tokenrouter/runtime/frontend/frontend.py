"""The frontend's view of the runtime: submit requests, stream their tokens, abort them.

It lives in one asyncio event loop (uvicorn's for `serve`, a private one for the offline
API) and owns the frontend's ZeroMQ sockets: a PULL socket where subservers report
(ready, heartbeats, tokens, done, stats replies, censuses, and handoffs to forward with the
`relay` transport), read by its receive loop, and a PUSH socket to every subserver.

Each request in flight is a `RequestStream` (`streams.py`), which puts the tokens of
several subservers back in order, keeps what it yielded and, given the tokenizer,
detokenises them and matches the request's stop strings (`text.py`). When it ends (done, a
stop string, abort, error) the frontend tells every subserver to release it (free its KV):
the same message for every ending, so invariant 3 has one code path. Its latency and token
counts go to `metrics` (`metrics.RequestMetrics`).

A request gets its route seed (the seed of the program's coin flips,
`protocol.state.route_seed_of`) from its caller, or from its request id when it gives none.

The frontend is composed of three parts it owns: `admission` (`admission.py`, KV admission
control: a request reserves its blocks before it is submitted and waits while they are
not free), `watch` (`liveness.py`: heartbeats, incarnations, restarts) and `recovery`
(`recovery.py`: the requests a dead subserver held are found and resumed, none fails).
Starting the subservers and a connected frontend is `launch.open_runtime`.

No frame stops the receive loop: a frame that does not decode is dropped and counted, one
from a process that is not the live incarnation of its writer (or a message only a
subserver takes) is dropped and counted as `stale` / `invalid`, and a `ready` is taken only
from the process the launcher started for a writer that is starting or down, with the
geometry of the first. Should the loop die anyway it is restarted (`loop_restarts`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable

import zmq
import zmq.asyncio

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import route_seed_of
from tokenrouter.runtime.frontend.admission import KvAdmission, blocks_needed
from tokenrouter.runtime.frontend.liveness import HEARTBEAT_TIMEOUT_S, MAX_RESTARTS, Watch
from tokenrouter.runtime.frontend.recovery import Recovery
from tokenrouter.runtime.frontend.streams import Delta, Final, RequestStream
from tokenrouter.runtime.frontend.text import TextStream
from tokenrouter.runtime.metrics import RequestMetrics
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.transport.security import (refused, secure_bind, secure_connect, stop_authenticator,
                                                    watch_handshakes)
from tokenrouter.runtime.transport.sockets import bind_form, bound_receive, check_address

__all__ = ["Delta", "Final", "Frontend", "RuntimeUnavailable"]

log = logging.getLogger(__name__)

FRONTEND = wire.FRONTEND
YIELD_EVERY = 64  # frames the receive loop reads before it lets other tasks run
GEOMETRY = ("block_size", "blocks_total", "max_model_len", "vocab_size")  # what a restart may not change


class RuntimeUnavailable(RuntimeError):
    """A subserver failed to start, is down, or the runtime gave up on it."""


class Frontend:
    def __init__(self, start_writer: str, addresses: dict[str, str], ctx: zmq.Context | None = None,
                 alive: Callable[[], dict[str, bool]] | None = None,
                 restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, max_restarts: int = MAX_RESTARTS,
                 on_fatal: Callable[[str], None] | None = None, security=None,
                 pids: Callable[[], dict[str, int]] | None = None):
        self.start_writer = start_writer
        self.addresses = addresses
        self.writers = [n for n in addresses if n != FRONTEND]
        self._ctx = zmq.asyncio.Context.shadow(ctx.underlying) if ctx is not None else zmq.asyncio.Context()
        self.security = security  # transport.Security (CURVE) or None
        self.pids = pids  # the launcher's: the process id of each local subserver it started
        self.admission = KvAdmission(lambda: self.healthy)
        self.reqs: dict[str, RequestStream] = {}
        self.watch = Watch(self.writers, end_all=self._fail_all, lost=self._lost, release=self._release_at,
                           wake=self.admission.wake, drained=self._drained, alive=alive, restart=restart,
                           heartbeat_timeout_s=heartbeat_timeout_s, max_restarts=max_restarts, on_fatal=on_fatal)
        self.recovery = Recovery(start_writer, self.writers, self.reqs, send=self._post, incarnation=self._inc,
                                 flush=self._flush, end=self._end, max_model_len=lambda: self.max_model_len)
        self.ready: dict[str, wire.Ready] = {}
        self.configured: dict[str, dict[str, Any]] = {}  # run-time `configure`s, given again after a restart
        self.metrics = RequestMetrics()
        self.finished: dict[str, int] = {}
        self.frames_dropped: dict[str, int] = {}
        self.loop_restarts = 0
        self._idle = False  # the receive loop waits with nothing to read
        self._drained_at = time.monotonic()
        self._started = False
        self._started_at = time.monotonic()
        self._closed = False
        self.start_failure: str | None = None
        self._stats_ids = itertools.count(1)
        self._stats_waiters: dict[int, tuple[asyncio.Future, dict[str, Any], set[str]]] = {}
        self._ready_event = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life
    @property
    def healthy(self) -> bool:
        """A request can complete now: every subserver is up and no recovery is under way."""
        return (self._started and not self._closed and self.watch.fatal is None and self.watch.all_up
                and not self.recovery.busy)

    @property
    def failure(self) -> str | None:
        """Why the runtime cannot take requests now (None when it can)."""
        if self.watch.fatal:
            return self.watch.fatal
        if self.start_failure:
            return self.start_failure
        down = "; ".join(self.watch.down())
        if not down and self._started and self.recovery.busy:
            return "recovering the requests of a subserver that died"
        return down or None

    def health(self) -> dict[str, dict[str, Any]]:
        return self.watch.health()

    async def start(self, timeout: float = 120.0) -> None:
        """Bind, connect, and wait until every subserver reported ready."""
        self._pull = self._ctx.socket(zmq.PULL)
        bound_receive(self._pull)
        self._pull.setsockopt(zmq.LINGER, 0)
        secure_bind(self._pull, self.addresses[FRONTEND], self.security)
        self._pull.bind(bind_form(check_address(self.addresses[FRONTEND])))
        self._monitor = watch_handshakes(self._pull, self.addresses[FRONTEND], self.security)
        if self._monitor is not None:
            self._tasks.append(asyncio.create_task(self._keep_running(self._count_refused, "the handshake watch")))
        self._push: dict[str, zmq.asyncio.Socket] = {}
        for w in self.writers:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 1000)
            secure_connect(s, self.addresses[w], self.security)
            s.connect(self.addresses[w])
            self._push[w] = s
        self._tasks.append(asyncio.create_task(self._keep_running(self._recv_loop, "the receive loop")))
        self._started_at = time.monotonic()
        deadline = self._started_at + timeout
        log.info("waiting for subservers %s to load their models", ", ".join(self.writers))
        while not self._ready_event.is_set():
            exited = [w for w, ok in self.watch.processes_alive().items() if not ok and w not in self.ready]
            if exited:
                raise RuntimeUnavailable(f"subserver {', '.join(exited)} exited during start-up")
            if time.monotonic() > deadline:
                missing = sorted(set(self.writers) - set(self.ready))
                raise RuntimeUnavailable(f"subservers did not start within {timeout:.0f} s: {', '.join(missing)}")
            try:
                await asyncio.wait_for(self._ready_event.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
        if self.start_failure:
            raise RuntimeUnavailable(self.start_failure)
        self.admission.capacity = min(r.blocks_total for r in self.ready.values())
        self._tell_peers()
        self._started = True
        self._tasks.append(self.watch.start())

    async def close(self, shutdown: bool = True) -> None:
        if shutdown:
            for w in self.writers:
                if self._inc(w):
                    self._post(w, wire.Shutdown(to=self._inc(w)))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in self._push.values():
            s.close(linger=1000)
        if self._monitor is not None:
            self._pull.disable_monitor()
            self._monitor.close(linger=0)
        self._pull.close(linger=0)
        stop_authenticator(self._ctx)
        self._closed = True

    @property
    def block_size(self) -> int:
        return max(r.block_size for r in self.ready.values())

    @property
    def max_model_len(self) -> int:
        return min(r.max_model_len for r in self.ready.values())

    @property
    def vocab_size(self) -> int:
        return min(r.vocab_size for r in self.ready.values())

    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        """The KV blocks a request reserves (`admission.blocks_needed`)."""
        return blocks_needed(prompt_len, max_tokens, self.block_size)

    @property
    def capacity_blocks(self) -> int:
        return self.admission.capacity

    # -------------------------------------------------------------- requests
    async def generate(self, prompt: list[int], params: SamplingParams, route_seed: int | None = None,
                       rid: str | None = None, tokenizer=None,
                       skip_special_tokens: bool = True) -> AsyncIterator[Delta | Final]:
        """Submit one request and yield its tokens as they are committed, then a `Final`.
        `route_seed` seeds the program's coin flips; None takes `route_seed_of(rid)`.
        With a `tokenizer`, every event carries its text and the request's stop strings end
        it (without one, stop strings are refused). A `Delta` that arrives with the request's
        end carries its `Final` too. Closing the iterator early (a client went away) aborts
        the request."""
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
                    self._post(w, wire.Submit(to=self._inc(w), rid=rid, prompt=list(prompt), sampling=params,
                                              route_seed=route_seed))
                else:
                    self._post(w, wire.Announce(to=self._inc(w), rid=rid))
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
        self.configured.setdefault(writer, {}).update(given)
        if self._inc(writer):
            self._post(writer, wire.Configure(to=self._inc(writer), **given))

    async def debug_fail(self, writer: str, count: int = 1) -> None:
        self._post(writer, wire.DebugFail(to=self._inc(writer), count=count))

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
            self._post(w, wire.Stats(to=self._inc(w), id=sid))
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
                "restarts": {w: lv.restarts for w, lv in self.watch.live.items()},
                "resumed": dict(self.recovery.resumed), "lost_tokens_refilled": self.recovery.lost_tokens,
                "frames_dropped": dict(self.frames_dropped), "loop_restarts": self.loop_restarts,
                "prompt_tokens": self.metrics.prompt_tokens, "generation_tokens": self.metrics.generation_tokens}

    # --------------------------------------------------------------- internals
    def _inc(self, writer: str) -> int:
        """`writer`'s live incarnation (0 while it is down)."""
        return self.watch.live[writer].inc

    def _post(self, writer: str, msg) -> None:
        """Send now (the PUSH sockets have no high-water mark: this never waits)."""
        self._push[writer].send(wire.encode(msg))

    def _drop(self, reason: str) -> None:
        self.frames_dropped[reason] = self.frames_dropped.get(reason, 0) + 1

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
                    self._post(w, wire.Release(to=self._inc(w), rid=live.rid, reason=reason))
                except zmq.ZMQError:
                    pass
        await self.admission.release(live.blocks)

    async def _release_at(self, writer: str, rid: str) -> None:
        """Release an ended request again at a subserver that came back (the watch's `release`)."""
        if self._inc(writer):
            self._post(writer, wire.Release(to=self._inc(writer), rid=rid, reason="error"))

    def _tell_peers(self) -> None:
        """Every live subserver learns every writer's live incarnation (0: down)."""
        incs = {w: self._inc(w) for w in self.writers}
        for w, inc in incs.items():
            if inc:
                self._post(w, wire.Peers(to=inc, incarnations=incs))

    def _drained(self) -> float:
        """The time up to which every frame that arrived has been read: now, while the
        receive loop waits and nothing is queued (the watch's `drained`)."""
        if self._idle and not self._pull.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return time.monotonic()
        return self._drained_at

    async def _keep_running(self, loop, what: str) -> None:
        """Run `loop` forever: should it ever raise, log it, count it and start it again."""
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.loop_restarts += 1
                log.exception("%s of the frontend died; starting it again", what)
                await asyncio.sleep(0.01)

    async def _recv_loop(self) -> None:
        read = 0
        while True:
            if not self._pull.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._drained_at, self._idle = time.monotonic(), True
            frame = await self._pull.recv()
            self._idle = False
            self._on_frame(frame)
            read += 1
            if read % YIELD_EVERY == 0:  # a flood of frames does not starve HTTP and the watchdog
                await asyncio.sleep(0)

    async def _count_refused(self) -> None:
        """Peers refused at the handshake (no keys, other keys): counted, never heard."""
        while True:
            if refused(await self._monitor.recv_multipart()):
                self._drop("unauthenticated")

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            log.warning("frontend dropped a frame: %s", exc)
            self._drop("invalid")
            return
        try:
            self._on_message(msg)
        except Exception:
            log.exception("frontend could not handle a %s message", type(msg).__name__)
            self._drop("error")

    def _on_message(self, msg) -> None:
        if isinstance(msg, wire.Ready):
            self._on_ready(msg)
            return
        if not isinstance(msg, (*wire.FROM_SUBSERVER, wire.Handoff)):
            self._drop("invalid")  # a message only a subserver takes
            return
        w = msg.sender if isinstance(msg, wire.Handoff) else msg.writer
        if not self.watch.accepts(w, msg.inc):
            self._refuse(w, msg.inc)
            return
        self.watch.seen(w)
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
        elif isinstance(msg, wire.Handoff):  # the `relay` transport: forward like a dispatcher would
            if msg.dest in self._push:
                self._push[msg.dest].send(wire.encode(msg))  # queued at once; never blocks (no HWM)
        elif isinstance(msg, wire.Census):
            self.recovery.on_census(msg)
        elif isinstance(msg, wire.StatsReply):
            w = self._stats_waiters.get(msg.id)
            if w is not None:
                fut, got, asked = w
                got[msg.writer] = msg.stats
                if set(got) >= asked and not fut.done():
                    fut.set_result(None)

    def _refuse(self, writer: str, inc: int) -> None:
        """A frame from a process that is not `writer`'s live incarnation: dropped and
        counted; a dead incarnation that speaks again (a paused process that resumed) is
        told to shut down (its successor, or a supervisor's restart, takes over)."""
        self._drop("stale")
        if self.watch.is_dead(writer, inc) and writer in self._push:
            self._post(writer, wire.Shutdown(to=inc))

    def _on_ready(self, msg: wire.Ready) -> None:
        why = self._refuse_ready(msg)
        if why is not None:
            log.warning("frontend refused a ready message from %r (pid %d): %s", msg.writer, msg.pid, why)
            self._drop("unexpected")
            return
        if msg.error:
            if not self._started:
                self.start_failure = f"subserver {msg.writer} failed to start: {msg.error}"
                self._ready_event.set()
            else:
                self.watch.restart_failed(msg.writer, msg.error)
            return
        self.ready[msg.writer] = msg
        self.watch.reported_ready(msg.writer, msg.pid, msg.inc)
        if not self._started:
            log.info("subserver %s ready after %.1f s (%d of %d)", msg.writer, time.monotonic() - self._started_at,
                     len(self.ready), len(self.writers))
            if set(self.ready) >= set(self.writers):
                self._ready_event.set()
            return
        self._back(msg.writer)

    def _refuse_ready(self, msg: wire.Ready) -> str | None:
        """Why a `ready` is not taken: an unknown writer, one that is up (a second ready
        cannot reconfigure anything), a process the launcher did not start, or a geometry
        other than the first's."""
        lv = self.watch.live.get(msg.writer)
        if lv is None:
            return "not a writer of this program"
        if lv.up or (self._started and self.watch.fatal):
            return "its writer is up" if lv.up else "the runtime gave up"
        if msg.inc in lv.dead:
            return "a dead incarnation"
        expected = (self.pids() if self.pids is not None else {}).get(msg.writer)
        if expected is not None and msg.pid != expected:
            return f"not the process the launcher started (pid {expected})"
        first = self.ready.get(msg.writer)
        if first is not None and not msg.error:
            changed = [g for g in GEOMETRY if getattr(msg, g) != getattr(first, g)]
            if changed:
                why = f"its {', '.join(changed)} differ from the first start's"
                self.watch.restart_failed(msg.writer, why)
                return why
        return None

    def _back(self, writer: str) -> None:
        """`writer` is up again: everyone learns its incarnation, it learns what is in flight
        (for delayed batching) and the run-time configuration, and it gets what waited for it."""
        inc = self._inc(writer)
        self._tell_peers()
        for rid, live in self.reqs.items():
            if not live.ended:
                self._post(writer, wire.Announce(to=inc, rid=rid))
        if self.configured.get(writer):
            self._post(writer, wire.Configure(to=inc, **self.configured[writer]))
        self.recovery.came_up(writer)

    def _flush(self, live: RequestStream) -> None:
        final = live.flush()
        if final is not None:
            self._end(live, final)
