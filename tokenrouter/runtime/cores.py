"""The host's cores, shared by need among the writers that run on it.

Each co-located subserver is a process with its own OpenMP thread team (torch's, MKL's and
the C kernels' share it). A fixed split (each of two writers one core of two) leaves a core
idle whenever one writer has nothing to step, which in a routed program is most of the
time for the large model; giving every writer all the cores oversubscribes them as soon as
two step at once, and an OpenMP team that loses a thread to the other process waits at
every barrier for it.

So cores go to the writers that are stepping *now*. A ledger in shared memory holds one
byte per local writer: set while that writer runs a step (`CoreShare.stepping`). A writer
reads it when a step launches and again between layers (`CoreShare.threads_now`, which the
engine's forward calls through `EngineOptions.threads`): alone it uses every core, beside
k others stepping it uses its share, `share(cores, k + 1, rank)`. A writer that does not
step holds nothing. Each writer writes only its own byte, so the ledger needs no lock.

Worker threads that spin after a parallel region would still hold a core after the step,
and on a small host every spinning thread is a core taken from the other writer, the
frontend and the sockets' threads: the launcher starts sharing subservers with OpenMP's
passive wait policy (`SPIN_ENV`), so an idle worker sleeps at once.
Which of the mechanisms won, and by how much, is measured by `benchmarks/bench_cores.py`
(docs/runtime.md, "Sharing the cores").
"""

from __future__ import annotations

import mmap
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

#: environment of a sharing subserver process: idle OpenMP workers sleep instead of spinning
SPIN_ENV = {"OMP_WAIT_POLICY": "passive"}


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in the environment that a child process started now inherits (a setting
    the user made explicitly wins), restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if k not in os.environ})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def host_cores() -> int:
    """The cores this process may run on (its affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share(cores: int, active: int, rank: int) -> int:
    """Threads for the writer of `rank` (0-based among the `active` writers stepping now,
    itself included) when `cores` are split among them: as even as integers allow, the
    remainder to the lowest ranks, and at least one."""
    active = max(1, active)
    base, extra = divmod(cores, active)
    return max(1, base + (1 if rank < extra else 0))


@dataclass(frozen=True)
class LedgerSpec:
    """Where the ledger is and which byte is this writer's (JSON-safe: crosses spawn)."""

    path: str
    slot: int
    slots: int
    cores: int


class Ledger:
    """The launcher's side: creates the shared file, one byte per local writer, and removes it."""

    def __init__(self, writers: list[str], cores: int | None = None):
        self.writers = list(writers)
        self.cores = cores or host_cores()
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, self.path = tempfile.mkstemp(prefix="tr-cores-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(max(1, len(self.writers))))

    def spec(self, writer: str) -> LedgerSpec:
        return LedgerSpec(self.path, self.writers.index(writer), len(self.writers), self.cores)

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


class CoreShare:
    """A writer's side of the ledger: marks its steps, and tells how many threads to use now."""

    def __init__(self, spec: LedgerSpec, set_threads=None):
        self.spec = spec
        with open(spec.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), spec.slots)
        self._map[spec.slot] = 0  # a restarted writer clears what its killed predecessor left
        self._set = set_threads or torch.set_num_threads
        self._current = 0
        self.changes = 0  # thread-count changes made (metrics: how often cores moved)

    def threads_now(self) -> int:
        """This writer's share among the writers stepping now (it counts itself when it steps),
        applied to torch's (and so the kernels') thread count when it changed."""
        m, me = self._map, self.spec.slot
        others = [i for i in range(self.spec.slots) if i != me and m[i]]
        rank = sum(1 for i in others if i < me)
        n = share(self.spec.cores, len(others) + 1, rank)
        if n != self._current:
            self._set(n)
            self._current = n
            self.changes += 1
        return n

    @contextmanager
    def stepping(self) -> Iterator[int]:
        """Hold this writer's share for the duration of one step."""
        self._map[self.spec.slot] = 1
        try:
            yield self.threads_now()
        finally:
            self._map[self.spec.slot] = 0

    def close(self) -> None:
        self._map[self.spec.slot] = 0
        self._map.close()
