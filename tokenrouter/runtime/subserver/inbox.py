"""A subserver's inbox: what its messaging loop hands to its decoding loop.

The messaging loop (a `transport.Receiver` thread) calls `on_frame` for every frame: it
parses and validates it (`wire.decode`), drops what fails (`invalid`), what the frontend
meant for another incarnation of this writer (`stale`: a restarted process binds its
predecessor's address, so frames queued for that one arrive here) and test-only messages
with test hooks off (`test_only`), each counted in `frames_dropped{reason}`; answers `stats` at once through
`on_stats` (so a long step never delays a scrape), and queues the rest. The queue is
bounded: at `MAX_INBOX` messages the messaging loop stops reading, which pushes back on
the senders instead of growing without bound. The decoding loop takes everything queued
between steps (`take`) and sleeps in `wait` when it has nothing to do.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

from tokenrouter.runtime.transport import wire

log = logging.getLogger(__name__)

MAX_INBOX = 4096  # queued messages; beyond it the messaging loop stops reading (backpressure)


class Inbox:
    def __init__(self, writer: str, incarnation: int, test_hooks: bool, on_stats: Callable[[wire.Stats], None],
                 dropped: Callable[[str], None]):
        self.writer, self.incarnation, self.test_hooks = writer, incarnation, test_hooks
        self.on_stats, self.dropped = on_stats, dropped
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closed = False

    def on_frame(self, frame: bytes) -> None:
        """Messaging loop: one frame from the socket."""
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            log.warning("%s: dropped a frame: %s", self.writer, exc)
            self.dropped("invalid")
            return
        if isinstance(msg, wire.ADDRESSED) and msg.to != self.incarnation:
            self.dropped("stale")
            return
        if isinstance(msg, wire.FROM_SUBSERVER):
            log.warning("%s: dropped a %r message, which only the frontend takes", self.writer, msg.t)
            self.dropped("invalid")
            return
        if msg.t in wire.TEST_ONLY and not self.test_hooks:
            log.warning("%s: refused a test-only %r message (test hooks are off)", self.writer, msg.t)
            self.dropped("test_only")
            return
        if isinstance(msg, wire.Stats):
            self.on_stats(msg)
            return
        with self._cv:
            while len(self._queue) >= MAX_INBOX and not self._closed:  # bounded: push back
                self._cv.wait(0.1)
            self._queue.append(msg)
            self._cv.notify_all()

    def take(self) -> list[wire.Message]:
        """Decoding loop: everything queued, oldest first."""
        with self._cv:
            msgs = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()  # room in the inbox again
        return msgs

    def wait(self, timeout: float | None) -> None:
        """Decoding loop: sleep until a message arrives or `timeout` seconds (None: no limit)."""
        with self._cv:
            if not self._queue:
                self._cv.wait(timeout)

    def close(self) -> None:
        """The subserver is stopping: a messaging loop blocked on a full inbox gives up."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
