"""Liveness: how the frontend notices a subserver is down, has its requests recovered, and
restarts it.

The frontend takes frames only from the *incarnation* of each writer that reported
`ready` (`accepts`): a frame from any other (a dead predecessor, a process the launcher did
not start) is dropped and counted. A subserver is *down* when

- its process exits: a local one's exit comes from the OS at once (the launcher watches
  each process's pidfd, `Launcher.watch_exits`, and calls `exited`; the watchdog also asks
  `alive` every `PERIOD_S`);
- it made no progress for `stall_window_s` (`--stall-window`, `STALL_WINDOW_S`): a
  stopped (SIGSTOP), deadlocked or hung process. Every subserver sends a heartbeat every
  0.5 s from a thread of its own that needs nothing of the step, carrying what its decoding
  loop did (`subserver/progress.py`): the turns it finished, whether it waits for messages,
  the CPU time its thread used. Progress is a heartbeat in which one of them moved (or
  that says it waits: idle is not stuck), or any frame of its decoding loop (tokens, done,
  a census). So a process that computes through a step of minutes, or whose heartbeats come
  late on a busy host, is never restarted: it shows progress whenever it is heard. One that
  is silent (stopped), or whose heartbeats arrive with nothing moving (a loop blocked on a
  lock), is;
- a *remote* subserver (one the launcher did not start: no OS to ask) is also down after
  `heartbeat_timeout_s` (`--heartbeat-timeout`, `HEARTBEAT_TIMEOUT_S`) with no frame at all.

Silence and the lack of progress are counted up to the moment the frontend's receive loop
had read everything that arrived (`drained`: a backlog of frames to parse, a flood of
invalid ones included, or a frontend that was itself held up, is not the subserver's
silence), but never from more than one stall window ago, so a flood delays a verdict by
one window at most. A subserver thread (thread mode) is down only when its thread ends. The
frontend keeps the longest gap between two heartbeats and between two signs of progress it
saw of each subserver (`/metrics`), the jitter the two limits must tolerate.

Once down, its incarnation is dead for good (a dead one that speaks again is told to shut
down), and `lost` starts the recovery of the requests it held (`recovery.py`); nothing in
flight fails. New requests get 503 while it is down, and /health and /metrics say which is
down. A local subserver is restarted with backoff (`restart`; a stopped or stuck process is
killed first); when it reports `ready` again serving resumes, and every request that ended
while it was down is released there once more. After `max_restarts` failed attempts in a
row the runtime is *fatal*: `end_all` ends every request in flight (HTTP 503 naming the
cause) and `on_fatal` is called (`tokenrouter serve` then exits with status 3, for a
supervisor to take over). A remote subserver is never restarted from here: it is up again
when a new incarnation of it reports ready.

Bounds: a local process's exit is noticed as soon as the event loop runs (well under a
second); a stopped or stuck one within `stall_window_s` + `PERIOD_S` + one heartbeat of its
last progress (`stall_window_s` more while a flood holds the receive loop), and its
replacement starts at once; a silent remote one within `heartbeat_timeout_s` + `PERIOD_S`.

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

from tokenrouter.runtime.logs import about
from tokenrouter.runtime.transport import wire

log = logging.getLogger(__name__)

# no progress this long is a hang. It must outlast every pause of a live process: a loaded
# host's scheduling and memory stalls (heartbeat gaps of seconds were seen: docs/runtime.md,
# "Faults and liveness"); a step's length does not count (its CPU time is progress). A
# false verdict costs a model load of minutes under the very load that caused it, a late
# one only delays the requests of a process that really hangs, which is rare.
STALL_WINDOW_S = 30.0
HEARTBEAT_TIMEOUT_S = 10.0  # a remote subserver silent this long is down (heartbeats come every 0.5 s)
PERIOD_S = 0.25  # the watchdog's period
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
    progress_at: float = 0.0  # ... of its last sign of progress
    beat_at: float = 0.0  # ... of its last heartbeat
    turns: int = 0  # the last heartbeat's loop turns and CPU milliseconds
    cpu_ms: int = 0
    beat_gap_max: float = 0.0  # the longest gap seen between two heartbeats, and between two signs of progress
    progress_gap_max: float = 0.0
    since: float = 0.0  # when it last came up
    down_at: float = 0.0  # when it was last declared down
    reason: str = ""  # why it is down
    cause: str = ""  # why it was last declared down (a restart's reason names it too)
    restarts: int = 0  # restarts done, ever
    failures: int = 0  # failed attempts in a row
    next_restart: float | None = None  # monotonic time of the next attempt
    restart_at: float = 0.0  # when the last attempt started
    ended: list[str] = field(default_factory=list)  # requests ended while it was down

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"up": self.up, "pid": self.pid, "incarnation": f"{self.inc:x}" if self.inc else None,
                "restarts": self.restarts,
                "last_seen_s": round(now - self.last_seen, 3) if self.last_seen else None,
                "last_progress_s": round(now - self.progress_at, 3) if self.progress_at and self.up else None,
                "reason": None if self.up else (self.reason or "starting")}

    def heard(self, msg: Any, now: float) -> None:
        """A frame from its live incarnation: a heartbeat in which anything moved (or that
        says the loop waits for work) is progress, and so is any frame of the decoding loop
        (a stats reply comes from the messaging loop: alive, not progress)."""
        self.last_seen = now
        if isinstance(msg, wire.Heartbeat):
            if self.beat_at:
                self.beat_gap_max = max(self.beat_gap_max, now - self.beat_at)
            self.beat_at = now
            moved = msg.waiting or msg.turns != self.turns or msg.cpu_ms > self.cpu_ms
            self.turns, self.cpu_ms = msg.turns, msg.cpu_ms
        else:
            moved = not isinstance(msg, wire.StatsReply)
        if moved:
            self.progress_gap_max = max(self.progress_gap_max, now - self.progress_at)
            self.progress_at = now

    def fresh(self, pid: int, inc: int, now: float) -> None:
        """A new incarnation reported ready: heard, and progressing, from now."""
        self.pid, self.inc = pid, inc
        self.last_seen = self.progress_at = now
        self.beat_at, self.turns, self.cpu_ms = 0.0, 0, 0


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

    The frontend reports what it hears (`seen`, `reported_ready`, `restart_failed`), the
    launcher the exits the OS reports (`exited`), and the frontend the requests that end
    (`remember_ended`); it reads `accepts`, `all_up`, `down()`, `health()` and `fatal`.
    """

    def __init__(self, writers: list[str], end_all: Callable[[str], int], lost: Callable[[str, int], None],
                 release: Callable[[str, str], Awaitable[None]], wake: Callable[[], Awaitable[None]],
                 drained: Callable[[], float] = time.monotonic,
                 alive: Callable[[], dict[str, bool]] | None = None, restart: Callable[[str], None] | None = None,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, stall_window_s: float = STALL_WINDOW_S,
                 max_restarts: int = MAX_RESTARTS, on_fatal: Callable[[str], None] | None = None):
        self.live: dict[str, Liveness] = {w: Liveness() for w in writers}
        self.end_all, self.lost, self.release, self.wake, self.drained = end_all, lost, release, wake, drained
        self.alive, self.restart = alive, restart
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.stall_window_s = stall_window_s
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal
        self.started = False  # every subserver reported ready once; the watchdog runs
        self.fatal: str | None = None
        self._poke = asyncio.Event()  # a process exited: check now

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

    def gaps(self) -> dict[str, dict[str, float]]:
        """The longest gap seen between two heartbeats and between two signs of progress, by subserver."""
        return {w: {"heartbeat": lv.beat_gap_max, "progress": lv.progress_gap_max} for w, lv in self.live.items()}

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

    def seen(self, writer: str, msg: Any) -> None:
        """A frame came from `writer`'s live incarnation."""
        self.live[writer].heard(msg, time.monotonic())

    def exited(self, writer: str) -> None:
        """The OS says a local subserver's process ended: look now, not at the next period."""
        self._poke.set()

    def reported_ready(self, writer: str, pid: int, inc: int) -> None:
        """`writer` reported ready: up at the start, or back after a restart (a new incarnation)."""
        lv = self.live[writer]
        lv.fresh(pid, inc, time.monotonic())
        if not self.started:
            lv.up, lv.since = True, lv.last_seen
        elif not lv.up:
            self.came_back(writer, f"ready again (pid {pid})")

    def restart_failed(self, writer: str, error: str) -> None:
        self.live[writer].reason = f"restart failed: {error}"

    # ------------------------------------------------------------------ watching
    async def watchdog(self, period: float = PERIOD_S) -> None:
        """Notice dead subservers (exited processes, stalled or silent ones) and restart local ones."""
        while True:
            try:
                await asyncio.wait_for(self._poke.wait(), period)
            except asyncio.TimeoutError:
                pass
            self._poke.clear()
            try:
                await self.check()
            except Exception:
                log.exception("liveness check failed")

    async def check(self) -> None:
        now = time.monotonic()
        # counted up to when no frame was waiting to be read, never from more than a window ago
        drained = max(self.drained(), now - self.stall_window_s)
        alive = self.processes_alive()
        threads = self.restart is None  # thread mode: local subservers are threads of this process
        for w, lv in self.live.items():
            if lv.up:
                # a subserver thread (thread mode: no restart) shares this process's GIL, which a
                # long Python-bound call elsewhere (a vLLM engine starting) can hold for seconds:
                # only its end (`alive`) is its death
                why = "its process exited" if alive.get(w) is False else (
                    None if threads and w in alive else self.verdict(lv, drained, remote=w not in alive))
                if why is not None:
                    await self.went_down(w, why)
                elif lv.failures and now - lv.since > STABLE_S:
                    lv.failures = 0
            elif self.restart is not None and w in alive and self.fatal is None:
                await self.maybe_restart(w, lv, alive[w], now)
            elif threads and w in alive and self.fatal is None:
                await self.give_up(f"subserver {w} is down ({lv.reason}) and cannot be restarted (thread mode)")

    def verdict(self, lv: Liveness, drained: float, remote: bool) -> str | None:
        """Why a subserver that is up (and whose process runs, if local) is down, or None."""
        silent, still = drained - lv.last_seen, drained - lv.progress_at
        if remote and silent > self.heartbeat_timeout_s:
            return f"no heartbeat for {silent:.1f} s"
        if still <= self.stall_window_s:
            return None
        window = f"the stall window is {self.stall_window_s:g} s"
        if drained - lv.beat_at < still / 2:  # heartbeats keep coming, with nothing moving
            return f"stuck: its heartbeats say its decoding loop made no progress for {still:.1f} s ({window})"
        return f"silent for {still:.1f} s: stopped or hung ({window})"

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
        lv.reason = f"restarting (attempt {lv.failures} of {self.max_restarts}; down because {lv.cause})"
        log.warning("subserver %s: %s", w, lv.reason, extra=about(w))
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
        lv.up, lv.reason, lv.cause, lv.next_restart, lv.down_at = False, reason, reason, None, time.monotonic()
        log.error("subserver %s is down (%s); recovering its requests", w, reason, extra=about(w))
        self.lost(w, dead)
        await self.wake()

    def came_back(self, w: str, how: str) -> None:
        lv = self.live[w]
        lv.up, lv.reason, lv.next_restart = True, "", None
        lv.since = lv.last_seen
        ended, lv.ended = lv.ended, []
        log.warning("subserver %s is up: %s; releasing %d requests that ended meanwhile", w, how, len(ended),
                    extra=about(w))
        asyncio.get_running_loop().create_task(self.release_again(w, ended))

    async def release_again(self, w: str, rids: list[str]) -> None:
        for rid in rids:
            await self.release(w, rid)
