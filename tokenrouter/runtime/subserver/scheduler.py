"""Per-subserver scheduler: request states and delayed batching, integers only.

A subserver serves one writer. Each request it knows is in one state:

    waiting    new here: its next step is a prefill of everything known
    running    ready to decode one token
    pending    away at a peer; it keeps its KV blocks here and the scheduler skips it
    returning  came back from a peer with a suffix: its next step is a short extend

(`finished` requests are removed.) `waiting`, `running` and `returning` are *ready*.

Delayed batching (invariant 4 of docs/architecture.md): a step is launched when at least B ready
requests are here, or when no more can arrive (every live request in the system is
already ready here), or when the oldest ready request has waited `max_wait_ns`, or when
the batch is full. So a subserver never waits for requests that cannot come, and never
longer than its maximum wait. Which requests share a step never changes their tokens
(invariant 5), so the order of a batch is simply oldest-ready first.

Times are integer nanoseconds passed in by the caller, which keeps this testable without
clocks, models or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["waiting", "running", "pending", "returning"]
READY: tuple[State, ...] = ("waiting", "running", "returning")


@dataclass
class _Entry:
    state: State
    ready_since: int  # ns; meaningful while ready


@dataclass(frozen=True)
class Decision:
    """Either a batch to step now, or how long to wait (None: until a message arrives)."""

    batch: tuple[str, ...] = ()
    wait_until: int | None = None
    reason: str = ""  # "threshold" | "no_more_can_arrive" | "max_wait" | "full" | "idle" | "waiting"


class Scheduler:
    def __init__(self, batch_threshold: int = 1, max_wait_ns: int = 20_000_000,
                 max_batch: int = 256):
        if batch_threshold < 1:
            raise ValueError(f"batch threshold must be >= 1, got {batch_threshold}")
        if max_wait_ns < 0:
            raise ValueError(f"max wait must be >= 0, got {max_wait_ns}")
        self.batch_threshold = batch_threshold
        self.max_wait_ns = max_wait_ns
        self.max_batch = max_batch
        self._entries: dict[str, _Entry] = {}
        self._live: set[str] = set()  # requests alive anywhere in the system

    # ------------------------------------------------------------- bookkeeping
    def announce(self, rid: str) -> None:
        """A request exists in the system (it may come here later)."""
        self._live.add(rid)

    def add(self, rid: str, now: int) -> None:
        """A request whose next step here is a prefill (new, or a first visit from a peer)."""
        if rid in self._entries:
            raise KeyError(f"request {rid!r} is already scheduled here")
        self._live.add(rid)
        self._entries[rid] = _Entry("waiting", now)

    def returned(self, rid: str, now: int) -> None:
        """A pending request came back with a suffix to append."""
        e = self._entries.get(rid)
        if e is None or e.state != "pending":
            raise KeyError(f"request {rid!r} is not pending here")
        self._live.add(rid)
        e.state, e.ready_since = "returning", now

    def depart(self, rid: str) -> None:
        """The request went to a peer: keep it (and its KV) but skip it."""
        self._entries[rid].state = "pending"

    def stepped(self, rids, now: int) -> None:
        """These requests completed a step and stay here: each decodes one token next."""
        for rid in rids:
            e = self._entries[rid]
            e.state, e.ready_since = "running", now

    def remove(self, rid: str) -> None:
        """The request ended: forget it here and in the live set."""
        self._entries.pop(rid, None)
        self._live.discard(rid)

    # ----------------------------------------------------------------- queries
    def state(self, rid: str) -> State | None:
        e = self._entries.get(rid)
        return e.state if e else None

    def ready_since(self, rid: str) -> int:
        return self._entries[rid].ready_since

    def __contains__(self, rid: str) -> bool:
        return rid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, state: State) -> int:
        return sum(1 for e in self._entries.values() if e.state == state)

    def ready(self) -> list[str]:
        """Ready requests, oldest first."""
        rs = [(e.ready_since, rid) for rid, e in self._entries.items() if e.state in READY]
        return [rid for _, rid in sorted(rs)]

    @property
    def live(self) -> int:
        return len(self._live)

    # ---------------------------------------------------------------- decision
    def decide(self, now: int) -> Decision:
        ready = self.ready()
        if not ready:
            return Decision(reason="idle")
        batch = tuple(ready[:max(1, self.max_batch)])  # oldest first; at least one
        oldest = self._entries[ready[0]].ready_since
        if len(ready) >= self.batch_threshold:
            return Decision(batch, reason="threshold")
        if len(batch) < len(ready) or len(batch) >= self.max_batch:
            return Decision(batch, reason="full")
        if not self._more_can_arrive(len(ready)):
            return Decision(batch, reason="no_more_can_arrive")
        deadline = oldest + self.max_wait_ns
        if now >= deadline:
            return Decision(batch, reason="max_wait")
        return Decision(wait_until=deadline, reason="waiting")

    def _more_can_arrive(self, n_ready: int) -> bool:
        # Every live request that is not ready here (pending here, or elsewhere) may come.
        return len(self._live) > n_ready
