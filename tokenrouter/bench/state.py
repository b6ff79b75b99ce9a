"""What the steps of a `tokenrouter bench` run pass each other (`runner.py` measures,
`documents.py` writes them up): the run's setup and what its levels measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrouter.runtime.launch import LaunchOptions

from tokenrouter.bench import configs as C


@dataclass
class Setup:
    """What every step of a run reads: the program and its pair, the prompts, the tuned B_i
    of each level, and the deployments' sizes."""

    program: Any
    small: str
    large: str
    writers: list[str]
    levels: list[int]
    cap: dict[int, int]  # the most requests one measurement at level N takes
    ids: list[list[int]]  # the prompts, encoded
    sampling: dict
    measured: list[str]  # the configurations measured (all but the derived ones)
    auto: list[str]  # the writers whose B_i the tuner chooses
    profile: Any  # Profile | None
    tuned: dict[int, dict[str, int]]  # level -> B_i
    blocks: int  # KV blocks of a deployment
    ctx: int  # context per slot of the llama.cpp servers
    base: LaunchOptions
    started: float  # time.time() when the run's clock started (after encoding the prompts)

    def batch_of(self, c: str, n: int) -> dict[str, int] | None:
        """B_i configuration `c` runs with at level `n` (None: as launched)."""
        if c.startswith("tokenrouter@"):
            return swept_batch(self.writers, self.large, int(c.split("@")[1]))
        return C.thresholds_for(c, self.program, self.tuned[n]) if c not in C.PER_LEVEL and c != "official" else None


@dataclass
class Measured:
    """What the per-level loop collected; a failed level keeps its reason and no rounds."""

    raw: dict[int, dict[str, list]] = field(default_factory=dict)  # level -> configuration -> rounds
    requests: dict[int, dict[str, int]] = field(default_factory=dict)  # level -> configuration -> requests
    load: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    builds: dict[str, str] = field(default_factory=dict)  # llama.cpp peer -> its server's system_info
    ggufs: dict[str, dict[str, str]] = field(default_factory=dict)  # llama.cpp peer -> model -> file served


def swept_batch(writers: list[str], large: str, b: int) -> dict[str, int]:
    batch = {w: 1 for w in writers}
    batch[large] = b
    return batch
