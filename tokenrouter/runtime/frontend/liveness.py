"""Liveness: how the frontend notices a subserver is down, fails what is in flight, and
restarts it.

Every subserver, local or remote, sends a heartbeat every 0.5 s (any frame from it
counts). A subserver is *down* when its process exits (local: the launcher sees it at
once) or nothing arrived from it for `heartbeat_timeout_s`. Then every request in flight
ends with an error naming it (the frontend cannot tell which requests hold KV there or
are on their way to it), new requests get 503, and /health and /metrics say which is
down. A local subserver is restarted with backoff (`restart`); when it reports `ready`
again serving resumes, and every request that ended while it was down is released there
once more (a handoff queued for the dead process may have recreated one). After
`max_restarts` failed attempts in a row the runtime is *fatal* and `on_fatal` is called
(`tokenrouter serve` then exits non-zero, for a supervisor to take over). A remote
subserver is never restarted from here: it is up again when it reports ready (or its
heartbeats resume).

`SubserverWatch` is the part of `Frontend` that does this (a mixin: it works on the
frontend's `live`, `reqs`, `fatal` and admission condition, and ends requests with its
`_end`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.frontend.streams import Final

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 3.0
MAX_RESTARTS = 5  # failed restarts in a row before the runtime gives up
RESTART_TIMEOUT_S = 180.0  # a restarted process must report ready within this
STABLE_S = 60.0  # up this long after a restart: the failure count starts again
ENDED_MEMORY = 100_000  # rids remembered per down subserver, to release again on its return


@dataclass
class Liveness:
    """What the frontend knows of one subserver's health."""

    up: bool = False
    pid: int = 0
    last_seen: float = 0.0  # monotonic time of its last frame
    since: float = 0.0  # when it last came up
    reason: str = ""  # why it is down
    restarts: int = 0  # restarts done, ever
    failures: int = 0  # failed attempts in a row
    next_restart: float | None = None  # monotonic time of the next attempt
    restart_at: float = 0.0  # when the last attempt started
    ended: list[str] = field(default_factory=list)  # requests ended while it was down

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"up": self.up, "pid": self.pid, "restarts": self.restarts,
                "last_seen_s": round(now - self.last_seen, 3) if self.last_seen else None,
                "reason": None if self.up else (self.reason or "starting")}


class SubserverWatch:
    """Liveness of the subservers, for `Frontend`."""

    def _remember_ended(self, rid: str) -> None:
        for lv in self.live.values():
            if not lv.up and len(lv.ended) < ENDED_MEMORY:
                lv.ended.append(rid)  # released there again when it is back

    def _seen(self, writer: str, pid: int | None = None) -> None:
        lv = self.live.get(writer)
        if lv is None:
            return
        lv.last_seen = time.monotonic()
        if not lv.up and self._started and pid is not None and pid == lv.pid and lv.reason.startswith("no heartbeat"):
            self._came_back(writer, "its heartbeats resumed")  # same process: a network pause

    async def _watchdog(self, period: float = 0.25) -> None:
        """Notice dead subservers (exited processes, silent peers) and restart local ones."""
        while True:
            await asyncio.sleep(period)
            try:
                await self._check()
            except Exception:
                log.exception("liveness check failed")

    async def _check(self) -> None:
        now = time.monotonic()
        # If this loop itself was held up, frames may be waiting unread: judge silence next time.
        stalled, self._last_check = now - self._last_check > 1.0, now
        alive = self._alive() if self._alive is not None else {}
        for w, lv in self.live.items():
            if lv.up:
                if alive.get(w) is False:
                    await self._went_down(w, "its process exited")
                elif now - lv.last_seen > self.heartbeat_timeout_s and not stalled:
                    await self._went_down(w, f"no heartbeat for {now - lv.last_seen:.1f} s")
                elif lv.failures and now - lv.since > STABLE_S:
                    lv.failures = 0
            elif self._restart is not None and w in alive and self.fatal is None:
                await self._maybe_restart(w, lv, alive[w], now)

    async def _maybe_restart(self, w: str, lv: Liveness, running: bool, now: float) -> None:
        if lv.next_restart is None:  # just went down: the first attempt comes at once
            lv.next_restart = now
        if running and lv.reason.startswith("restarting"):
            if now - lv.restart_at < RESTART_TIMEOUT_S:
                return  # the new process is loading its models
            lv.reason = f"a restart did not report ready within {RESTART_TIMEOUT_S:.0f} s"
        elif now < lv.next_restart:
            return
        if lv.failures >= self.max_restarts:
            self.fatal = (f"subserver {w} is down and {self.max_restarts} restarts in a row failed "
                          f"(last: {lv.reason}); giving up")
            log.error("%s", self.fatal)
            for live in list(self.reqs.values()):
                self._end(live, Final("error", live.next, {}, self.fatal))
            async with self._admit:
                self._admit.notify_all()
            if self.on_fatal is not None:
                self.on_fatal(self.fatal)
            return
        lv.failures += 1
        lv.restarts += 1
        lv.restart_at = now
        lv.next_restart = now + min(30.0, 0.5 * 2 ** lv.failures)  # backoff if this one fails too
        lv.reason = f"restarting (attempt {lv.failures} of {self.max_restarts})"
        log.warning("subserver %s: %s", w, lv.reason)
        await asyncio.get_running_loop().run_in_executor(None, self._restart, w)

    async def _went_down(self, w: str, reason: str) -> None:
        lv = self.live[w]
        lv.up, lv.reason, lv.next_restart = False, reason, None
        msg = f"subserver {w} is down ({reason})"
        log.error("%s; failing %d requests", msg, len(self.reqs))
        for live in list(self.reqs.values()):
            self._end(live, Final("error", live.next, {}, msg))
        async with self._admit:
            self._admit.notify_all()

    def _came_back(self, w: str, how: str) -> None:
        lv = self.live[w]
        lv.up, lv.reason, lv.next_restart = True, "", None
        lv.since = lv.last_seen = time.monotonic()
        ended, lv.ended = lv.ended, []
        log.warning("subserver %s is up: %s; releasing %d requests that ended meanwhile", w, how, len(ended))
        loop = asyncio.get_running_loop()
        loop.create_task(self._release_again(w, ended))

    async def _release_again(self, w: str, rids: list[str]) -> None:
        for rid in rids:
            await self._send(w, wire.Release(rid=rid, reason="error"))
