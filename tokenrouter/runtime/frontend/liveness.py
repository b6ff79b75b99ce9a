"""Liveness: how the frontend notices a subserver is down, has its requests recovered, and
restarts it.

Every subserver, local or remote, sends a heartbeat every 0.5 s (any frame from it
counts). The frontend takes frames only from the *incarnation* of each writer that
reported `ready` (`accepts`): a frame from any other (a dead predecessor, a process the
launcher did not start) is dropped and counted. A subserver is *down* when its process
exits (local: the launcher sees it at once) or nothing arrived from it for
`heartbeat_timeout_s` while the frontend's receive loop was keeping up (`drained`: a
backlog of frames to parse, a flood of invalid ones included, is not silence; a subserver
thread, in thread mode, is down only when its thread ends). Then its
incarnation is dead for good (a dead one that speaks again is told to shut down), and
`lost` starts the recovery of the requests it held (`recovery.py`); nothing in flight
fails. New requests get 503 while it is down, and /health and /metrics say which is down.
A local subserver is restarted with backoff (`restart`); when it reports `ready` again
serving resumes, and every request that ended while it was down is released there once
more. After `max_restarts` failed attempts in a row the runtime is *fatal*: `end_all`
ends every request in flight (HTTP 503 naming the cause) and `on_fatal` is called
(`tokenrouter serve` then exits with status 3, for a supervisor to take over). A remote
subserver is never restarted from here: it is up again when a new incarnation of it
reports ready.

`Watch` does this for the `Frontend`, which owns it and hands it what it needs as
callables (`Watch.__init__`); it holds the subservers' `Liveness` records and the fatal
state, and nothing of the frontend's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 3.0
BACKLOG_LIMIT = 4  # silent this many heartbeat timeouts is a death even while frames keep the receive loop busy
MAX_RESTARTS = 5  # failed restarts in a row before the runtime gives up
RESTART_TIMEOUT_S = 180.0  # a restarted process must report ready within this
STABLE_S = 60.0  # up this long after a restart: the failure count starts again
ENDED_MEMORY = 100_000  # rids remembered per down subserver, to release again on its return


@dataclass
class Liveness:
    """What the frontend knows of one subserver's health."""

    up: bool = False
    pid: int = 0
    inc: int = 0  # the incarnation whose frames are taken; 0 while down
    dead: set[int] = field(default_factory=set)  # its incarnations declared dead
    last_seen: float = 0.0  # monotonic time of its last frame
    since: float = 0.0  # when it last came up
    reason: str = ""  # why it is down
    restarts: int = 0  # restarts done, ever
    failures: int = 0  # failed attempts in a row
    next_restart: float | None = None  # monotonic time of the next attempt
    restart_at: float = 0.0  # when the last attempt started
    ended: list[str] = field(default_factory=list)  # requests ended while it was down

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"up": self.up, "pid": self.pid, "incarnation": f"{self.inc:x}" if self.inc else None,
                "restarts": self.restarts,
                "last_seen_s": round(now - self.last_seen, 3) if self.last_seen else None,
                "reason": None if self.up else (self.reason or "starting")}


class Watch:
    """Liveness of the subservers, for the `Frontend`, which gives it:

    end_all(message)            end every request in flight (restarts are exhausted);
                                returns how many
    lost(writer, inc)           incarnation `inc` of `writer` is dead: recover its requests
    release(writer, rid)        send `writer` a `release` of `rid` (a coroutine)
    wake()                      let requests waiting for admission look again (a coroutine)
    drained()                   the time up to which every frame received has been read
    alive()                     the launcher's: which local subservers' processes run
    restart(writer)             the launcher's: start a new process for `writer`
    on_fatal(message)           restarts are exhausted (`tokenrouter serve` exits)

    The frontend reports what it hears (`seen`, `reported_ready`, `restart_failed`) and
    the requests that end (`remember_ended`), and reads `accepts`, `all_up`, `down()`,
    `health()` and `fatal`.
    """

    def __init__(self, writers: list[str], end_all: Callable[[str], int], lost: Callable[[str, int], None],
                 release: Callable[[str, str], Awaitable[None]], wake: Callable[[], Awaitable[None]],
                 drained: Callable[[], float] = time.monotonic,
                 alive: Callable[[], dict[str, bool]] | None = None, restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, max_restarts: int = MAX_RESTARTS,
                 on_fatal: Callable[[str], None] | None = None):
        self.live: dict[str, Liveness] = {w: Liveness() for w in writers}
        self.end_all, self.lost, self.release, self.wake, self.drained = end_all, lost, release, wake, drained
        self.alive, self.restart = alive, restart
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal
        self.started = False  # every subserver reported ready once; the watchdog runs
        self.fatal: str | None = None

    # ------------------------------------------------------------ the frontend asks
    @property
    def all_up(self) -> bool:
        return all(lv.up for lv in self.live.values())

    def down(self) -> list[str]:
        """Why each subserver that is down is down (none before the start)."""
        return [f"subserver {w} is down ({lv.reason})" for w, lv in self.live.items() if self.started and not lv.up]

    def health(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        return {w: lv.to_dict(now) for w, lv in self.live.items()}

    def processes_alive(self) -> dict[str, bool]:
        return self.alive() if self.alive is not None else {}

    def accepts(self, writer: str, inc: int) -> bool:
        """Frames from this incarnation of `writer` are taken (it reported ready and is not dead)."""
        lv = self.live.get(writer)
        return lv is not None and inc != 0 and lv.inc == inc

    def is_dead(self, writer: str, inc: int) -> bool:
        lv = self.live.get(writer)
        return lv is not None and inc in lv.dead

    # ------------------------------------------------------------ the frontend tells
    def start(self) -> asyncio.Task:
        """Every subserver is up: from now on watch them (the watchdog task)."""
        self.started = True
        return asyncio.get_running_loop().create_task(self.watchdog())

    def remember_ended(self, rid: str) -> None:
        """A request ended: released again at each subserver that is down, when it is back."""
        for lv in self.live.values():
            if not lv.up and len(lv.ended) < ENDED_MEMORY:
                lv.ended.append(rid)

    def seen(self, writer: str) -> None:
        """A frame came from `writer`'s live incarnation."""
        self.live[writer].last_seen = time.monotonic()

    def reported_ready(self, writer: str, pid: int, inc: int) -> None:
        """`writer` reported ready: up at the start, or back after a restart (a new incarnation)."""
        lv = self.live[writer]
        lv.pid, lv.inc, lv.last_seen = pid, inc, time.monotonic()
        if not self.started:
            lv.up, lv.since = True, lv.last_seen
        elif not lv.up:
            self.came_back(writer, f"ready again (pid {pid})")

    def restart_failed(self, writer: str, error: str) -> None:
        self.live[writer].reason = f"restart failed: {error}"

    # ------------------------------------------------------------------ watching
    async def watchdog(self, period: float = 0.25) -> None:
        """Notice dead subservers (exited processes, silent peers) and restart local ones."""
        while True:
            await asyncio.sleep(period)
            try:
                await self.check()
            except Exception:
                log.exception("liveness check failed")

    async def check(self) -> None:
        now = time.monotonic()
        # silent: nothing from it up to a moment when no frame was waiting to be read (a
        # receive loop held up by a backlog, or this loop held up, is not its silence), or
        # nothing for BACKLOG_LIMIT timeouts whatever the backlog. A subserver thread (thread
        # mode: no restart) is never silent for good: it shares this process's GIL, which a
        # long Python-bound call elsewhere (a vLLM engine starting) can hold for seconds;
        # its end is seen by `alive`
        drained = max(self.drained(), now - (BACKLOG_LIMIT - 1) * self.heartbeat_timeout_s)
        alive = self.processes_alive()
        threads = self.restart is None  # thread mode: local subservers are threads of this process
        for w, lv in self.live.items():
            if lv.up:
                if alive.get(w) is False:
                    await self.went_down(w, "its process exited")
                elif drained - lv.last_seen > self.heartbeat_timeout_s and not (threads and w in alive):
                    await self.went_down(w, f"no heartbeat for {drained - lv.last_seen:.1f} s")
                elif lv.failures and now - lv.since > STABLE_S:
                    lv.failures = 0
            elif self.restart is not None and w in alive and self.fatal is None:
                await self.maybe_restart(w, lv, alive[w], now)
            elif threads and w in alive and self.fatal is None:
                await self.give_up(f"subserver {w} is down ({lv.reason}) and cannot be restarted (thread mode)")

    async def maybe_restart(self, w: str, lv: Liveness, running: bool, now: float) -> None:
        if lv.next_restart is None:  # just went down: the first attempt comes at once
            lv.next_restart = now
        if running and lv.reason.startswith("restarting"):
            if now - lv.restart_at < RESTART_TIMEOUT_S:
                return  # the new process is loading its models
            lv.reason = f"a restart did not report ready within {RESTART_TIMEOUT_S:.0f} s"
        elif now < lv.next_restart:
            return
        if lv.failures >= self.max_restarts:
            await self.give_up(f"subserver {w} is down and {self.max_restarts} restarts in a row failed "
                               f"(last: {lv.reason}); giving up")
            return
        lv.failures += 1
        lv.restarts += 1
        lv.restart_at = now
        lv.next_restart = now + min(30.0, 0.5 * 2 ** lv.failures)  # backoff if this one fails too
        lv.reason = f"restarting (attempt {lv.failures} of {self.max_restarts})"
        log.warning("subserver %s: %s", w, lv.reason)
        await asyncio.get_running_loop().run_in_executor(None, self.restart, w)

    async def give_up(self, why: str) -> None:
        """The runtime is fatal: end what is in flight, say why, and tell `on_fatal`."""
        self.fatal = why
        log.error("%s", why)
        self.end_all(why)
        await self.wake()
        if self.on_fatal is not None:
            self.on_fatal(why)

    async def went_down(self, w: str, reason: str) -> None:
        lv = self.live[w]
        dead, lv.inc = lv.inc, 0
        lv.dead.add(dead)
        lv.up, lv.reason, lv.next_restart = False, reason, None
        log.error("subserver %s is down (%s); recovering its requests", w, reason)
        self.lost(w, dead)
        await self.wake()

    def came_back(self, w: str, how: str) -> None:
        lv = self.live[w]
        lv.up, lv.reason, lv.next_restart = True, "", None
        lv.since = lv.last_seen = time.monotonic()
        ended, lv.ended = lv.ended, []
        log.warning("subserver %s is up: %s; releasing %d requests that ended meanwhile", w, how, len(ended))
        asyncio.get_running_loop().create_task(self.release_again(w, ended))

    async def release_again(self, w: str, rids: list[str]) -> None:
        for rid in rids:
            await self.release(w, rid)
