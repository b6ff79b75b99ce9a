"""The frontend's view of the runtime: submit requests, stream their tokens, abort them.

It lives in one asyncio event loop (uvicorn's for `serve`, a private one for the offline
API) and owns the frontend's ZeroMQ sockets: a PULL socket where subservers report
(ready, tokens, done, stats replies, and handoffs to forward with the `relay` transport)
and a PUSH socket to every subserver.

Each request in flight is a `RequestStream` (`frontend_streams.py`), which puts the tokens
of several subservers back in order. When it ends (done, abort, error) the frontend tells
every subserver to release it (free its KV): the same message for every ending, so
invariant 3 has one code path.

Admission control keeps the KV caches from filling up mid-request (a pending request
keeps its blocks at the writers it left, so running out of blocks could otherwise
deadlock): a request reserves ceil((prompt + max_tokens) / block_size) + 1 blocks of the
smallest cache before it is submitted, and waits in a FIFO queue here while they are not
free.

Liveness (heartbeats, failing what is in flight, restarts) is `frontend_liveness.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from typing import Any, AsyncIterator, Callable

import zmq
import zmq.asyncio

from tokenrouter.runtime.transport import wire
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import route_seed_of
from tokenrouter.runtime.frontend.liveness import HEARTBEAT_TIMEOUT_S, MAX_RESTARTS, Liveness, SubserverWatch
from tokenrouter.runtime.frontend.streams import Delta, Final, RequestStream
from tokenrouter.runtime.transport.sockets import bind_form, bound_receive, check_address

__all__ = ["Delta", "Final", "Frontend", "RuntimeUnavailable", "close_runtime", "open_runtime"]

log = logging.getLogger(__name__)

FRONTEND = wire.FRONTEND


class RuntimeUnavailable(RuntimeError):
    """A subserver failed to start, is down, or the runtime gave up on it."""


class Frontend(SubserverWatch):
    def __init__(self, start_writer: str, addresses: dict[str, str], ctx: zmq.Context | None = None,
                 alive: Callable[[], dict[str, bool]] | None = None,
                 restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, max_restarts: int = MAX_RESTARTS,
                 on_fatal: Callable[[str], None] | None = None, security=None):
        self.start_writer = start_writer
        self.addresses = addresses
        self.writers = [n for n in addresses if n != FRONTEND]
        self._ctx = zmq.asyncio.Context.shadow(ctx.underlying) if ctx is not None else zmq.asyncio.Context()
        self._alive = alive
        self._restart = restart
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal
        self.security = security  # transport.Security (CURVE) or None
        self.live: dict[str, Liveness] = {w: Liveness() for w in self.writers}
        self.ready: dict[str, wire.Ready] = {}
        self.reqs: dict[str, RequestStream] = {}
        self.finished: dict[str, int] = {}
        self.frames_dropped: dict[str, int] = {}
        self._started = False
        self._closed = False
        self._last_check = 0.0
        self.start_failure: str | None = None
        self.fatal: str | None = None
        self._stats_ids = itertools.count(1)
        self._stats_waiters: dict[int, tuple[asyncio.Future, dict[str, Any], set[str]]] = {}
        self._ready_event = asyncio.Event()
        self._capacity = 0
        self._reserved = 0
        self._admit = asyncio.Condition()
        self._queued = 0
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life
    @property
    def healthy(self) -> bool:
        return (self._started and not self._closed and self.fatal is None
                and all(lv.up for lv in self.live.values()))

    @property
    def failure(self) -> str | None:
        """Why the runtime cannot take requests now (None when it can)."""
        if self.fatal:
            return self.fatal
        if self.start_failure:
            return self.start_failure
        down = [f"subserver {w} is down ({lv.reason})" for w, lv in self.live.items() if self._started and not lv.up]
        return "; ".join(down) or None

    def health(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        return {w: lv.to_dict(now) for w, lv in self.live.items()}

    async def start(self, timeout: float = 120.0) -> None:
        """Bind, connect, and wait until every subserver reported ready."""
        from tokenrouter.runtime.transport.sockets import secure_bind, secure_connect
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
            exited = [w for w, ok in (self._alive() if self._alive else {}).items() if not ok and w not in self.ready]
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
        self._capacity = min(r.blocks_total for r in self.ready.values())
        self._started = True
        self._tasks.append(asyncio.create_task(self._watchdog()))

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
        from tokenrouter.runtime.transport.sockets import stop_authenticator
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
        return math.ceil((prompt_len + max_tokens) / max(1, self.block_size)) + 1

    @property
    def capacity_blocks(self) -> int:
        return self._capacity

    # -------------------------------------------------------------- requests
    async def generate(self, prompt: list[int], params: SamplingParams, route_seed: int | None = None,
                       rid: str | None = None) -> AsyncIterator[Delta | Final]:
        """Submit one request and yield its tokens as they are committed, then a `Final`.
        `route_seed` seeds the program's coin flips; None takes `route_seed_of(rid)`.
        Closing the iterator early (a client went away) aborts the request."""
        if not self.healthy:
            raise RuntimeUnavailable(self.failure or "the runtime is not running")
        rid = rid or uuid.uuid4().hex
        if route_seed is None:
            route_seed = route_seed_of(rid)
        blocks = self.blocks_needed(len(prompt), params.max_tokens)
        if blocks > self._capacity:
            raise ValueError(f"the request needs {blocks} KV blocks, more than the {self._capacity} there are")
        live = RequestStream(rid, blocks)
        finished = False
        try:
            await self._reserve(blocks)
            self.reqs[rid] = live
            for w in self.writers:
                if w == self.start_writer:
                    await self._send(w, wire.Submit(rid=rid, prompt=list(prompt), sampling=params,
                                                    route_seed=route_seed))
                else:
                    await self._send(w, wire.Announce(rid=rid))
            while True:
                ev = await live.queue.get()
                if isinstance(ev, Final):
                    finished = True
                    yield ev
                    return
                yield ev
        finally:
            if not finished:
                self.abort(rid)

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
        asked = [w for w in self.writers if self.live[w].up]  # a down subserver cannot answer
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
                "queued": self._queued, "writers": list(self.writers),
                "up": {w: lv.up for w, lv in self.live.items()},
                "restarts": {w: lv.restarts for w, lv in self.live.items()},
                "frames_dropped": dict(self.frames_dropped)}

    # --------------------------------------------------------------- internals
    async def _send(self, writer: str, msg) -> None:
        await self._push[writer].send(wire.encode(msg))

    async def _reserve(self, blocks: int) -> None:
        async with self._admit:
            self._queued += 1
            try:
                await self._admit.wait_for(lambda: self._reserved + blocks <= self._capacity or not self.healthy)
            finally:
                self._queued -= 1
            if not self.healthy:
                raise RuntimeUnavailable(self.failure or "the runtime stopped")
            self._reserved += blocks

    def _end(self, live: RequestStream, final: Final) -> None:
        """Finish a request once: tell its consumer, release it everywhere, free its reservation."""
        if live.ended:
            return
        live.ended = True
        live.queue.put_nowait(final)
        self.finished[final.reason] = self.finished.get(final.reason, 0) + 1
        self.reqs.pop(live.rid, None)
        self._remember_ended(live.rid)
        asyncio.get_running_loop().create_task(self._release(live, final.reason))

    async def _release(self, live: RequestStream, reason: str) -> None:
        for w in self.writers:
            try:
                await self._send(w, wire.Release(rid=live.rid, reason=reason))
            except zmq.ZMQError:
                pass
        async with self._admit:
            self._reserved -= live.blocks
            self._admit.notify_all()

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
            self._seen(w, getattr(msg, "pid", None))
        if isinstance(msg, wire.Heartbeat):
            return
        if isinstance(msg, wire.Tokens):
            for rid, pos, tok in msg.items:
                live = self.reqs.get(rid)
                if live is None or live.ended:
                    continue
                live.buf[pos] = (tok, msg.writer)
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
            lv = self.live.get(msg.writer)
            if lv is None:
                return
            if msg.error:
                if not self._started:
                    self.start_failure = f"subserver {msg.writer} failed to start: {msg.error}"
                    self._ready_event.set()
                else:
                    lv.reason = f"restart failed: {msg.error}"
                return
            self.ready[msg.writer] = msg
            lv.pid, lv.last_seen = msg.pid, time.monotonic()
            if not self._started:
                lv.up, lv.since = True, lv.last_seen
                if set(self.ready) >= set(self.writers):
                    self._ready_event.set()
            elif not lv.up:
                self._came_back(msg.writer, f"ready again (pid {msg.pid})")
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


async def open_runtime(program, opts=None, timeout: float = 180.0, **liveness):
    """Start the subservers of `program` and a connected `Frontend` in the running loop.
    `liveness`: heartbeat_timeout_s, max_restarts, on_fatal (see `Frontend`)."""
    from tokenrouter.runtime.frontend.launch import Launcher
    launcher = Launcher(program, opts).start()
    fe = Frontend(program.start if program.start in launcher.specs else launcher.local[0],
                  launcher.addresses, ctx=launcher.ctx, alive=launcher.alive,
                  restart=launcher.restart if launcher.opts.mode == "process" else None,
                  security=launcher.security, **liveness)
    try:
        await fe.start(timeout)
    except BaseException:
        await fe.close()
        await asyncio.get_running_loop().run_in_executor(None, launcher.stop, 5.0)
        raise
    return launcher, fe


async def close_runtime(launcher, fe: Frontend) -> None:
    await fe.close()
    await asyncio.get_running_loop().run_in_executor(None, launcher.stop)
