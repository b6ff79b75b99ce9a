"""The frontend's endpoint (`transport/sockets.py`): a PULL socket where subservers report
(ready, heartbeats, tokens, done, stats replies, censuses, and handoffs to forward with the
`relay` transport), read by the receive loop, and a PUSH socket to every subserver.

No frame stops the receive loop: a frame that does not decode is dropped and counted
(`frames_dropped`, `invalid`), and so is one whose handling raises (`error`); peers refused
at the CURVE handshake are counted too (`unauthenticated`). Should the loop die anyway it is
restarted (`loop_restarts`). The loop yields to other tasks every `YIELD_EVERY` frames, so a
flood of frames does not starve HTTP and the liveness watch, and it tells the watch up to
when it has read everything that arrived (`drained`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import zmq
import zmq.asyncio

from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.transport.security import (refused, secure_bind, secure_connect, stop_authenticator,
                                                    watch_handshakes)
from tokenrouter.runtime.transport.sockets import bind_form, bound_receive, check_address

log = logging.getLogger(__name__)

YIELD_EVERY = 64  # frames the receive loop reads before it lets other tasks run


class Endpoint:
    """`addresses`: the frontend's (`wire.FRONTEND`) and every writer's; `ctx`: a ZeroMQ
    context to share (thread mode), else one of its own; `security`: `transport.Security`
    (CURVE) or None; `on_message`: what the frontend does with each decoded message."""

    def __init__(self, addresses: dict[str, str], writers: list[str], on_message: Callable[[wire.Message], None],
                 ctx: zmq.Context | None = None, security=None):
        self.addresses = addresses
        self.writers = writers
        self.on_message = on_message
        self.security = security
        self._ctx = zmq.asyncio.Context.shadow(ctx.underlying) if ctx is not None else zmq.asyncio.Context()
        self.frames_dropped: dict[str, int] = {}
        self.loop_restarts = 0
        self._idle = False  # the receive loop waits with nothing to read
        self._drained_at = time.monotonic()

    def open(self) -> list[asyncio.Task]:
        """Bind, connect, and start the receive loop (and the handshake watch): their tasks."""
        here = self.addresses[wire.FRONTEND]
        self._pull = self._ctx.socket(zmq.PULL)
        bound_receive(self._pull)
        self._pull.setsockopt(zmq.LINGER, 0)
        secure_bind(self._pull, here, self.security)
        self._pull.bind(bind_form(check_address(here)))
        tasks = []
        self._monitor = watch_handshakes(self._pull, here, self.security)
        if self._monitor is not None:
            tasks.append(asyncio.create_task(self._keep_running(self._count_refused, "the handshake watch")))
        self._push: dict[str, zmq.asyncio.Socket] = {}
        for w in self.writers:
            s = self._ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 1000)
            secure_connect(s, self.addresses[w], self.security)
            s.connect(self.addresses[w])
            self._push[w] = s
        tasks.append(asyncio.create_task(self._keep_running(self._recv_loop, "the receive loop")))
        return tasks

    def close(self) -> None:
        """Close the sockets (the tasks `open` started are the caller's to cancel first)."""
        for s in self._push.values():
            s.close(linger=1000)
        if self._monitor is not None:
            self._pull.disable_monitor()
            self._monitor.close(linger=0)
        self._pull.close(linger=0)
        stop_authenticator(self._ctx)

    def post(self, writer: str, msg) -> None:
        """Send now (the PUSH sockets have no high-water mark: this never waits)."""
        self._push[writer].send(wire.encode(msg))

    def forward(self, msg: wire.Handoff) -> None:
        """A handoff to forward (the `relay` transport), like a dispatcher would; to a writer
        this frontend does not know, dropped."""
        if msg.dest in self._push:
            self._push[msg.dest].send(wire.encode(msg))  # queued at once; never blocks (no HWM)

    def drop(self, reason: str) -> None:
        self.frames_dropped[reason] = self.frames_dropped.get(reason, 0) + 1

    def drained(self) -> float:
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
                self.drop("unauthenticated")

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            log.warning("frontend dropped a frame: %s", exc)
            self.drop("invalid")
            return
        try:
            self.on_message(msg)
        except Exception:
            log.exception("frontend could not handle a %s message", type(msg).__name__)
            self.drop("error")
