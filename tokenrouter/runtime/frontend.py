"""The frontend's view of the runtime: submit requests, stream their tokens, abort them.

It lives in one asyncio event loop (uvicorn's for `serve`, a private one for the offline
API) and owns the frontend's ZeroMQ sockets: a PULL socket where subservers report
(ready, tokens, done, stats replies) and a PUSH socket to every subserver.

Tokens of one request are committed by different subservers, and frames from different
senders are not ordered with respect to each other, so each request keeps a small reorder
buffer keyed by output position; it ends when the `done` report has arrived *and* every
token before it. Then the frontend tells every subserver to release it (free its KV), the
same message an abort sends, so invariant 3 has one code path.

Admission control keeps the KV caches from filling up mid-request (a pending request
pins its blocks, so running out of blocks could otherwise deadlock): a request reserves
ceil((prompt + max_tokens) / block_size) + 1 blocks of the smallest cache before it is
submitted, and waits in a FIFO queue here while they are not free.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import zmq
import zmq.asyncio

from tokenrouter.runtime import wire
from tokenrouter.runtime.transport import bind_form, check_address

log = logging.getLogger(__name__)

FRONTEND = "frontend"


class RuntimeUnavailable(RuntimeError):
    """A subserver failed to start or exited."""


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
class _Live:
    rid: str
    blocks: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    buf: dict[int, tuple[int, str]] = field(default_factory=dict)  # position -> (token, writer)
    next: int = 0
    done: wire.Done | None = None
    ended: bool = False


class Frontend:
    def __init__(self, start_writer: str, addresses: dict[str, str], ctx: zmq.Context | None = None,
                 alive: Callable[[], dict[str, bool]] | None = None):
        self.start_writer = start_writer
        self.addresses = addresses
        self.writers = [n for n in addresses if n != FRONTEND]
        self._ctx = zmq.asyncio.Context.shadow(ctx.underlying) if ctx is not None else zmq.asyncio.Context()
        self._alive = alive
        self.ready: dict[str, wire.Ready] = {}
        self.reqs: dict[str, _Live] = {}
        self.finished: dict[str, int] = {}
        self.healthy = False
        self.failure: str | None = None
        self._stats_ids = itertools.count(1)
        self._stats_waiters: dict[int, tuple[asyncio.Future, dict[str, Any]]] = {}
        self._ready_event = asyncio.Event()
        self._capacity = 0
        self._reserved = 0
        self._admit = asyncio.Condition()
        self._queued = 0
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life
    async def start(self, timeout: float = 120.0) -> None:
        """Bind, connect, and wait until every subserver reported ready."""
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(bind_form(check_address(self.addresses[FRONTEND])))
        self._push: dict[str, zmq.asyncio.Socket] = {}
        for w in self.writers:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(self.addresses[w])
            self._push[w] = s
        self._tasks.append(asyncio.create_task(self._recv_loop()))
        if self._alive is not None:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        try:
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(self.writers) - set(self.ready))
            raise RuntimeUnavailable(f"subservers did not start within {timeout:.0f} s: {', '.join(missing)}") from None
        if self.failure:
            raise RuntimeUnavailable(self.failure)
        self._capacity = min(r.blocks_total for r in self.ready.values())
        self.healthy = True

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
        self.healthy = False

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
    async def generate(self, prompt: list[int], sampling: dict[str, Any], seed: int = 0,
                       rid: str | None = None) -> AsyncIterator[Delta | Final]:
        """Submit one request and yield its tokens as they are committed, then a `Final`.
        Closing the iterator early (a client went away) aborts the request."""
        if not self.healthy:
            raise RuntimeUnavailable(self.failure or "the runtime is not running")
        rid = rid or uuid.uuid4().hex
        blocks = self.blocks_needed(len(prompt), int(sampling.get("max_tokens", 16)))
        if blocks > self._capacity:
            raise ValueError(f"the request needs {blocks} KV blocks, more than the {self._capacity} there are")
        live = _Live(rid, blocks)
        finished = False
        try:
            await self._reserve(blocks)
            self.reqs[rid] = live
            for w in self.writers:
                if w == self.start_writer:
                    await self._send(w, wire.Submit(rid=rid, prompt=list(prompt), sampling=sampling, seed=seed))
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
        self._stats_waiters[sid] = (fut, got)
        for w in self.writers:
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
                "queued": self._queued, "writers": list(self.writers)}

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

    def _end(self, live: _Live, final: Final) -> None:
        """Finish a request once: tell its consumer, release it everywhere, free its reservation."""
        if live.ended:
            return
        live.ended = True
        live.queue.put_nowait(final)
        self.finished[final.reason] = self.finished.get(final.reason, 0) + 1
        self.reqs.pop(live.rid, None)
        asyncio.get_running_loop().create_task(self._release(live, final.reason))

    async def _release(self, live: _Live, reason: str) -> None:
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
                continue
            try:
                self._on_message(msg)
            except Exception:
                log.exception("frontend could not handle a %s message", type(msg).__name__)

    def _on_message(self, msg) -> None:
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
        elif isinstance(msg, wire.Handoff):  # relay mode: forward like a dispatcher would
            self._push[msg.dest].send(wire.encode(msg))  # queued at once; never blocks (no HWM)
        elif isinstance(msg, wire.Ready):
            if msg.error:
                self.failure = f"subserver {msg.writer} failed to start: {msg.error}"
                self._ready_event.set()
                return
            self.ready[msg.writer] = msg
            if set(self.ready) >= set(self.writers):
                self._ready_event.set()
        elif isinstance(msg, wire.StatsReply):
            w = self._stats_waiters.get(msg.id)
            if w is not None:
                fut, got = w
                got[msg.writer] = msg.stats
                if set(got) >= set(self.writers) and not fut.done():
                    fut.set_result(None)

    def _flush(self, live: _Live) -> None:
        run, by = [], []
        while live.next in live.buf:
            tok, writer = live.buf.pop(live.next)
            run.append(tok)
            by.append(writer)
            live.next += 1
        if run:
            live.queue.put_nowait(Delta(run, by))
        d = live.done
        if d is not None and live.next >= d.n_out:
            self._end(live, Final(d.reason, d.n_out, d.written_by, d.error))

    async def _watchdog(self) -> None:
        """End every request with an error when a subserver process dies."""
        while True:
            await asyncio.sleep(0.5)
            dead = [w for w, ok in self._alive().items() if not ok]
            if dead and self.failure is None:
                self.healthy = False
                self.failure = f"subserver {', '.join(sorted(dead))} exited"
                self._ready_event.set()
                log.error("%s; failing %d requests", self.failure, len(self.reqs))
                for live in list(self.reqs.values()):
                    self._end(live, Final("error", live.next, {}, self.failure))
                async with self._admit:
                    self._admit.notify_all()


async def open_runtime(program, opts=None, timeout: float = 180.0):
    """Start the subservers of `program` and a connected `Frontend` in the running loop."""
    from tokenrouter.runtime.launcher import Launcher
    launcher = Launcher(program, opts).start()
    fe = Frontend(program.start if program.start in launcher.specs else launcher.local[0],
                  launcher.addresses, ctx=launcher.ctx, alive=launcher.alive)
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
