"""The frontend's view of the runtime: submit requests, stream their tokens, abort them.

It lives in one asyncio event loop (uvicorn's for `serve`, a private one for the offline
API) and owns the frontend's ZeroMQ sockets: a PULL socket where subservers report
(ready, heartbeats, tokens, done, stats replies, and handoffs to forward with the `relay`
transport), read by its receive loop, and a PUSH socket to every subserver.

Each request in flight is a `RequestStream` (`streams.py`), which puts the tokens of
several subservers back in order and, given the tokenizer, detokenises them and matches
the request's stop strings (`text.py`). When it ends (done, a stop string, abort, error)
the frontend tells every subserver to release it (free its KV): the same message for every
ending, so invariant 3 has one code path. Its latency and token counts go to `metrics`
(`metrics.RequestMetrics`).

A request gets its route seed (the seed of the program's coin flips,
`protocol.state.route_seed_of`) from its caller, or from its request id when it gives none.

The frontend is composed of two parts it owns: `admission` (`admission.py`, KV admission
control: a request reserves its blocks before it is submitted and waits while they are
not free) and `watch` (`liveness.py`: heartbeats, failing what is in flight when a
subserver is down, restarts). Starting the subservers and a connected frontend is
`launch.open_runtime`.
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
from tokenrouter.runtime.frontend.streams import Delta, Final, RequestStream
from tokenrouter.runtime.frontend.text import TextStream
from tokenrouter.runtime.metrics import RequestMetrics
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.transport.security import secure_bind, secure_connect, stop_authenticator
from tokenrouter.runtime.transport.sockets import bind_form, bound_receive, check_address

__all__ = ["Delta", "Final", "Frontend", "RuntimeUnavailable"]

log = logging.getLogger(__name__)

FRONTEND = wire.FRONTEND


class RuntimeUnavailable(RuntimeError):
    """A subserver failed to start, is down, or the runtime gave up on it."""


class Frontend:
    def __init__(self, start_writer: str, addresses: dict[str, str], ctx: zmq.Context | None = None,
                 alive: Callable[[], dict[str, bool]] | None = None,
                 restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, max_restarts: int = MAX_RESTARTS,
                 on_fatal: Callable[[str], None] | None = None, security=None):
        self.start_writer = start_writer
        self.addresses = addresses
        self.writers = [n for n in addresses if n != FRONTEND]
        self._ctx = zmq.asyncio.Context.shadow(ctx.underlying) if ctx is not None else zmq.asyncio.Context()
        self.security = security  # transport.Security (CURVE) or None
        self.admission = KvAdmission(lambda: self.healthy)
        self.watch = Watch(self.writers, end_all=self._fail_all, release=self._release_at,
                           wake=self.admission.wake, alive=alive, restart=restart,
                           heartbeat_timeout_s=heartbeat_timeout_s, max_restarts=max_restarts, on_fatal=on_fatal)
        self.ready: dict[str, wire.Ready] = {}
        self.reqs: dict[str, RequestStream] = {}
        self.metrics = RequestMetrics()
        self.finished: dict[str, int] = {}
        self.frames_dropped: dict[str, int] = {}
        self._started = False
        self._closed = False
        self.start_failure: str | None = None
        self._stats_ids = itertools.count(1)
        self._stats_waiters: dict[int, tuple[asyncio.Future, dict[str, Any], set[str]]] = {}
        self._ready_event = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life
    @property
    def healthy(self) -> bool:
        return self._started and not self._closed and self.watch.fatal is None and self.watch.all_up

    @property
    def failure(self) -> str | None:
        """Why the runtime cannot take requests now (None when it can)."""
        if self.watch.fatal:
            return self.watch.fatal
        if self.start_failure:
            return self.start_failure
        return "; ".join(self.watch.down()) or None

    def health(self) -> dict[str, dict[str, Any]]:
        return self.watch.health()

    async def start(self, timeout: float = 120.0) -> None:
        """Bind, connect, and wait until every subserver reported ready."""
        self._pull = self._ctx.socket(zmq.PULL)
        bound_receive(self._pull)
        self._pull.setsockopt(zmq.LINGER, 0)
        secure_bind(self._pull, self.addresses[FRONTEND], self.security)
        self._pull.bind(bind_form(check_address(self.addresses[FRONTEND])))
        self._push: dict[str, zmq.asyncio.Socket] = {}
        for w in self.writers:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 1000)
            secure_connect(s, self.addresses[w], self.security)
            s.connect(self.addresses[w])
            self._push[w] = s
        self._tasks.append(asyncio.create_task(self._recv_loop()))
        deadline = time.monotonic() + timeout
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
        self._started = True
        self._tasks.append(self.watch.start())

    async def close(self, shutdown: bool = True) -> None:
        if shutdown:
            for w in self.writers:
                await self._send(w, wire.Shutdown())
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in self._push.values():
            s.close(linger=1000)
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
        live = RequestStream(rid, blocks, text, prompt_len=len(prompt))
        finished = False
        try:
            if not await self.admission.reserve(blocks):
                raise RuntimeUnavailable(self.failure or "the runtime stopped")
            live.submitted = time.monotonic()
            self.reqs[rid] = live
            for w in self.writers:
                if w == self.start_writer:
                    await self._send(w, wire.Submit(rid=rid, prompt=list(prompt), sampling=params,
                                                    route_seed=route_seed))
                else:
                    await self._send(w, wire.Announce(rid=rid))
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
        """Change a subserver's delayed batching at run time."""
        await self._send(writer, wire.Configure(batch_threshold=batch_threshold, max_wait_ms=max_wait_ms))

    async def debug_fail(self, writer: str, count: int = 1) -> None:
        await self._send(writer, wire.DebugFail(count=count))

    async def stats(self, timeout: float = 5.0) -> dict[str, dict[str, Any]]:
        """A snapshot of every subserver's counters (those that answer in time)."""
        sid = next(self._stats_ids)
        fut = asyncio.get_running_loop().create_future()
        got: dict[str, Any] = {}
        asked = [w for w in self.writers if self.watch.live[w].up]  # a down subserver cannot answer
        if not asked:
            return {}
        self._stats_waiters[sid] = (fut, got, set(asked))
        for w in asked:
            await self._send(w, wire.Stats(id=sid))
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
                "frames_dropped": dict(self.frames_dropped),
                "prompt_tokens": self.metrics.prompt_tokens, "generation_tokens": self.metrics.generation_tokens}

    # --------------------------------------------------------------- internals
    async def _send(self, writer: str, msg) -> None:
        await self._push[writer].send(wire.encode(msg))

    def _end(self, live: RequestStream, final: Final) -> None:
        """Finish a request once: tell its consumer, release it everywhere, free its reservation."""
        if live.ended:
            return
        live.ended = True
        live.queue.put_nowait(final)
        self.finished[final.reason] = self.finished.get(final.reason, 0) + 1
        self.reqs.pop(live.rid, None)
        self.metrics.observe(live.arrived, live.submitted, live.token_times, time.monotonic(),
                             live.prompt_len, live.next)
        self.watch.remember_ended(live.rid)
        asyncio.get_running_loop().create_task(self._release(live, final.reason))

    def _fail_all(self, message: str) -> int:
        """End every request in flight with an error (the watch's `end_all`); how many."""
        ended = list(self.reqs.values())
        for live in ended:
            self._end(live, Final("error", live.next, {}, message))
        return len(ended)

    async def _release(self, live: RequestStream, reason: str) -> None:
        for w in self.writers:
            try:
                await self._send(w, wire.Release(rid=live.rid, reason=reason))
            except zmq.ZMQError:
                pass
        await self.admission.release(live.blocks)

    async def _release_at(self, writer: str, rid: str) -> None:
        """Release an ended request again at a subserver that came back (the watch's `release`)."""
        await self._send(writer, wire.Release(rid=rid, reason="error"))

    async def _recv_loop(self) -> None:
        while True:
            frame = await self._pull.recv()
            try:
                msg = wire.decode(frame)
            except wire.WireError as exc:
                log.warning("frontend dropped a frame: %s", exc)
                self.frames_dropped["invalid"] = self.frames_dropped.get("invalid", 0) + 1
                continue
            try:
                self._on_message(msg)
            except Exception:
                log.exception("frontend could not handle a %s message", type(msg).__name__)
                self.frames_dropped["error"] = self.frames_dropped.get("error", 0) + 1

    def _on_message(self, msg) -> None:
        w = getattr(msg, "writer", None)
        if w is not None and not isinstance(msg, wire.Ready):
            self.watch.seen(w, getattr(msg, "pid", None))
        if isinstance(msg, wire.Heartbeat):
            return
        if isinstance(msg, wire.Tokens):
            for rid, pos, tok in msg.items:
                live = self.reqs.get(rid)
                if live is None or live.ended:
                    continue
                live.buf[pos] = (tok, msg.writer, msg.logprobs.get(rid))
            for rid in {i[0] for i in msg.items}:
                live = self.reqs.get(rid)
                if live is not None:
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
            self._push[msg.dest].send(wire.encode(msg))  # queued at once; never blocks (no HWM)
        elif isinstance(msg, wire.Ready):
            self._on_ready(msg)
        elif isinstance(msg, wire.StatsReply):
            w = self._stats_waiters.get(msg.id)
            if w is not None:
                fut, got, asked = w
                got[msg.writer] = msg.stats
                if set(got) >= asked and not fut.done():
                    fut.set_result(None)

    def _on_ready(self, msg: wire.Ready) -> None:
        if msg.writer not in self.watch.live:
            return
        if msg.error:
            if not self._started:
                self.start_failure = f"subserver {msg.writer} failed to start: {msg.error}"
                self._ready_event.set()
            else:
                self.watch.restart_failed(msg.writer, msg.error)
            return
        self.ready[msg.writer] = msg
        self.watch.reported_ready(msg.writer, msg.pid)
        if not self._started and set(self.ready) >= set(self.writers):
            self._ready_event.set()

    def _flush(self, live: RequestStream) -> None:
        final = live.flush()
        if final is not None:
            self._end(live, final)
