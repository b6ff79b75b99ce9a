"""What a subserver's heartbeat says of its decoding loop, so that the frontend can tell a
process that is alive and busy from one that is alive but stuck (`frontend/liveness.py`).

The decoding loop counts its turns (`turn`: messages applied, a step run, a wait ended) and
says when it waits for messages (`waiting`). The heartbeat thread reads that, with the CPU
time the decoding loop's thread has used so far (`cpu_ms`: its thread's CPU clock, which
a long step advances while a blocked thread's does not; the process's where a thread has no
clock of its own). None of it needs the step to finish: a step of a minute still shows its
CPU time every beat, a loop blocked on a lock shows nothing moving.

`hold` is the test hook behind `debug_hold`: the loop holds for a while, computing or
blocked.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from tokenrouter.runtime.transport import wire


class Progress:
    """Written by the decoding loop, read by the heartbeat thread (single values, so the
    reads need no lock)."""

    def __init__(self) -> None:
        self.turns = 0
        self.is_waiting = False
        self._clock: int | None = None

    def attach(self) -> None:
        """Called by the decoding loop's thread: from now on `cpu_ms` is that thread's."""
        try:
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):
            self._clock = None

    def turn(self) -> None:
        self.turns += 1

    @contextmanager
    def waiting(self):
        """The decoding loop waits for messages: idle, not stuck."""
        self.is_waiting = True
        try:
            yield
        finally:
            self.is_waiting = False

    def cpu_ms(self) -> int:
        """CPU milliseconds the decoding loop's thread used (the process's without a thread clock)."""
        if self._clock is not None:
            try:
                return int(time.clock_gettime(self._clock) * 1000)
            except OSError:  # the thread ended
                pass
        return int(time.process_time() * 1000)

    def heartbeat(self, writer: str, pid: int, inc: int) -> wire.Heartbeat:
        return wire.Heartbeat(writer=writer, pid=pid, inc=inc, turns=self.turns, waiting=self.is_waiting,
                              cpu_ms=self.cpu_ms())


def hold(seconds: float, busy: bool) -> None:
    """`debug_hold`: hold the decoding loop for `seconds`, computing (`busy`, as a long step
    would: in Python, so it also holds the GIL between switches) or blocked without using the
    CPU (as a deadlock would)."""
    if not busy:
        threading.Event().wait(seconds)
        return
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x = (x * 31 + 7) % 1000003
