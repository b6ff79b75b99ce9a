"""The frontend's control plane: which subservers are ready, what they learn of each other,
and what one that comes back is told.

A `ready` is taken only from the process the launcher started for a writer that is starting
or down, with the geometry of its first start (`GEOMETRY`); any other is dropped and counted
(`unexpected`). At start-up every writer's first `ready` (or its start-up error) is awaited
(`wait_ready`); after it a `ready` is a restart: everyone learns the new incarnation
(`peers`), the subserver learns what is in flight (`announce`, for delayed batching) and the
run-time configuration (`configure`), and recovery gives it what waited for it. A frame from
a process that is not its writer's live incarnation is dropped and counted (`stale`); a
dead incarnation that speaks again (a paused process that resumed) is told to shut down (its
successor, or a supervisor's restart, takes over).

`ControlPlane` does this for the `Frontend`, which owns it and hands it its liveness watch,
its recovery, its requests in flight and what it may do as callables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from tokenrouter.runtime.frontend.liveness import Watch
from tokenrouter.runtime.frontend.recovery import Recovery
from tokenrouter.runtime.frontend.streams import RequestStream
from tokenrouter.runtime.transport import wire

log = logging.getLogger(__name__)

GEOMETRY = ("block_size", "blocks_total", "max_model_len", "vocab_size")  # what a restart may not change
EXIT_REPORT_S = 1.0  # how long an exit seen during start-up waits for the failure report sent before it


class RuntimeUnavailable(RuntimeError):
    """A subserver failed to start, is down, or the runtime gave up on it."""


class ControlPlane:
    """`post(writer, msg)` sends a message, `inc(writer)` is a writer's live incarnation (0
    while it is down), `drop(reason)` counts a dropped frame and `pids()` gives the process
    id of each local subserver the launcher started (None: no launcher)."""

    def __init__(self, writers: list[str], watch: Watch, recovery: Recovery, reqs: dict[str, RequestStream],
                 post: Callable[[str, Any], None], inc: Callable[[str], int], drop: Callable[[str], None],
                 pids: Callable[[], dict[str, int]] | None = None):
        self.writers = writers
        self.watch = watch
        self.recovery = recovery
        self.reqs = reqs
        self.post, self.inc, self.drop, self.pids = post, inc, drop, pids
        self.ready: dict[str, wire.Ready] = {}  # each writer's first `ready`
        self.configured: dict[str, dict[str, Any]] = {}  # run-time `configure`s, given again after a restart
        self.start_failure: str | None = None
        self.started = False  # every writer was ready and learnt its peers
        self._started_at = time.monotonic()
        self._all_ready = asyncio.Event()

    async def wait_ready(self, timeout: float) -> None:
        """Wait until every subserver reported ready; RuntimeUnavailable if one exited, failed
        to start, or the `timeout` ran out."""
        self._started_at = time.monotonic()
        deadline = self._started_at + timeout
        log.info("waiting for subservers %s to load their models", ", ".join(self.writers))
        while not self._all_ready.is_set():
            exited = [w for w, ok in self.watch.processes_alive().items() if not ok and w not in self.ready]
            if exited:
                # a subserver whose start-up failed reports why, then exits: its report may still
                # be on its way when the exit is seen, and it says more than the exit does
                try:
                    await asyncio.wait_for(self._all_ready.wait(), EXIT_REPORT_S)
                except asyncio.TimeoutError:
                    pass
                raise RuntimeUnavailable(self.start_failure or f"subserver {', '.join(exited)} exited during start-up")
            if time.monotonic() > deadline:
                missing = sorted(set(self.writers) - set(self.ready))
                raise RuntimeUnavailable(f"subservers did not start within {timeout:.0f} s: {', '.join(missing)}")
            try:
                await asyncio.wait_for(self._all_ready.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
        if self.start_failure:
            raise RuntimeUnavailable(self.start_failure)

    def configure(self, writer: str, given: dict[str, Any]) -> None:
        """Change a subserver's delayed batching (again after a restart)."""
        self.configured.setdefault(writer, {}).update(given)
        if self.inc(writer):
            self.post(writer, wire.Configure(to=self.inc(writer), **given))

    def tell_peers(self) -> None:
        """Every live subserver learns every writer's live incarnation (0: down)."""
        incs = {w: self.inc(w) for w in self.writers}
        for w, inc in incs.items():
            if inc:
                self.post(w, wire.Peers(to=inc, incarnations=incs))

    def refuse(self, writer: str, inc: int) -> None:
        """A frame from a process that is not `writer`'s live incarnation: dropped and
        counted; a dead incarnation that speaks again is told to shut down."""
        self.drop("stale")
        if self.watch.is_dead(writer, inc) and writer in self.writers:
            self.post(writer, wire.Shutdown(to=inc))

    def on_ready(self, msg: wire.Ready) -> None:
        why = self._refuse_ready(msg)
        if why is not None:
            log.warning("frontend refused a ready message from %r (pid %d): %s", msg.writer, msg.pid, why)
            self.drop("unexpected")
            return
        if msg.error:
            if not self.started:
                self.start_failure = f"subserver {msg.writer} failed to start: {msg.error}"
                self._all_ready.set()
            else:
                self.watch.restart_failed(msg.writer, msg.error)
            return
        self.ready[msg.writer] = msg
        self.watch.reported_ready(msg.writer, msg.pid, msg.inc)
        if not self.started:
            log.info("subserver %s ready after %.1f s (%d of %d)", msg.writer, time.monotonic() - self._started_at,
                     len(self.ready), len(self.writers))
            if set(self.ready) >= set(self.writers):
                self._all_ready.set()
            return
        self._back(msg.writer)

    def _refuse_ready(self, msg: wire.Ready) -> str | None:
        """Why a `ready` is not taken: an unknown writer, one that is up (a second ready
        cannot reconfigure anything), a process the launcher did not start, or a geometry
        other than the first's."""
        lv = self.watch.live.get(msg.writer)
        if lv is None:
            return "not a writer of this program"
        if lv.up or (self.started and self.watch.fatal):
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
        inc = self.inc(writer)
        self.tell_peers()
        for rid, live in self.reqs.items():
            if not live.ended:
                self.post(writer, wire.Announce(to=inc, rid=rid))
        if self.configured.get(writer):
            self.post(writer, wire.Configure(to=inc, **self.configured[writer]))
        self.recovery.came_up(writer)
