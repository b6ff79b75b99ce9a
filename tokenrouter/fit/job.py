"""What a fit reads, holds and returns between its steps (`fitting.py` runs the steps):
the options, the checked job, the prompts as token ids, the pair of engines stepped in
lockstep, the labelled rows, the trained tensors, and the network's scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.weights import nets as rn
from tokenrouter.fit import collect, train
from tokenrouter.fit.errors import FitError
from tokenrouter.fit.target import Target
from tokenrouter.runtime.loader import resolve_folder


@dataclass
class FitOptions:
    route: str
    router: str
    prompts: str
    out: str
    epochs: int = 30
    seed: int = 0
    min_recall: float | None = None
    target_share: float | None = None
    holdout: float = 0.2
    max_tokens: int = 48
    batch: int = 32
    eval_prompts: str | None = None
    eval_max_tokens: int | None = None
    eval_max_prompts: int | None = None  # the first N of --eval-prompts (default: all)
    report: str | None = None  # default: OUT without .safetensors + ".report.json" / ".png"
    threads: int = 1
    progress: bool = True
    cache: bool = False  # remember the lockstep passes (labelled rows, baselines) under the cache root
    align: bool = True  # shift the output logit so that the program's own threshold is the chosen one
    hyper: train.Hyper = field(default_factory=train.Hyper)
    params: dict[str, str] | None = None  # --set NAME=VALUE
    model_paths: dict[str, str] | None = None  # --model NAME=PATH


@dataclass
class FitResult:
    out: str
    report_json: str
    report_png: str
    threshold: float
    route_lines: list[str]
    report: dict


@dataclass
class Job:
    """What `fit` reads and checks before a model is loaded."""

    rows: list[dict]
    eval_rows: list[dict] | None
    program: ir.Program
    target: Target
    min_recall: float | None  # the threshold rule: exactly one of these two is set
    target_share: float | None

    @property
    def threshold_rule(self) -> dict:
        return {"min_recall": self.min_recall} if self.min_recall is not None else {"target_share": self.target_share}


@dataclass
class Prompts:
    """The prompts as token ids, and the seeded split of the training prompts."""

    ids: list[list[int]]
    train_idx: list[int]
    held_idx: list[int]
    eval_ids: list[list[int]]  # the first --eval-max-prompts of --eval-prompts (none without it)
    eval_tokens: int
    max_len: int  # the longest sequence either engine holds


@dataclass
class Pair:
    """Both engines, stepped together over prompts (`collect.cached_lockstep`) with the
    router's declared inputs."""

    small: Any  # runtime Engine
    large: Any
    hidden: int  # the small model's hidden size
    inputs: tuple  # the router's inputs (a head reads hidden(-1))
    layout: str  # the inputs as text: the cached rows' column layout
    fingerprints: dict  # {"reads": ..., "large": ...}: each model's name and folder fingerprint
    dtypes: tuple[str, str]
    stop: set[int]
    batch: int
    progress: bool
    cache: bool

    @classmethod
    def start(cls, job: Job, tok, max_len: int, opts: FitOptions) -> "Pair":
        small_m, large_m = job.program.model(job.target.model), job.program.model(job.target.large)
        router = job.target.router
        small = collect.make_engine(small_m, max_len, opts.batch)
        large = collect.make_engine(large_m, max_len, opts.batch)
        hidden = small.config.hidden_size
        if router is None:
            inputs = (ir.InputHidden(-1, hidden),)
        else:
            inputs = router.inputs
            if any(w <= 0 for w in rn.input_widths(router)):
                raise FitError(f"router '{router.name}': the input widths of '{router.model}' are unknown")
        fps = {"reads": {"name": small_m.path, "fingerprint": rn.folder_fingerprint(resolve_folder(small_m.path)[1])},
               "large": {"name": large_m.path, "fingerprint": rn.folder_fingerprint(resolve_folder(large_m.path)[1])}}
        layout = rn.layout_text(router) if router is not None else f"hidden(-1):{hidden}"
        return cls(small, large, hidden, inputs, layout, fps, (small_m.dtype, large_m.dtype), set(tok.eos_token_ids),
                   opts.batch, opts.progress, opts.cache)

    def key(self, prompt_ids: list[list[int]], tokens: int, decisions: str) -> str | None:
        """The cache key of a pass (None without --cache)."""
        if not self.cache:
            return None
        return collect.cache_key(models=[self.fingerprints["reads"]["fingerprint"],
                                         self.fingerprints["large"]["fingerprint"], *self.dtypes],
                                 prompts=prompt_ids, tokens=tokens, decisions=decisions)

    def lockstep(self, prompt_ids: list[list[int]], tokens: int, decisions: str, decide,
                 desc: str) -> tuple[collect.Rows, collect.Rollout]:
        """One pass over `prompt_ids` (`decide`: see collect.lockstep; `decisions` names it in the cache key)."""
        return collect.cached_lockstep(self.key(prompt_ids, tokens, decisions), self.layout, self.small, self.large,
                                       prompt_ids, self.inputs, tokens, self.batch, self.stop, decide, desc=desc,
                                       progress=self.progress)


@dataclass
class Data:
    """The labelled positions of the training prompts, split by prompt."""

    train: collect.Rows
    held: collect.Rows
    seconds: float


@dataclass
class Trained:
    tensors: dict[str, torch.Tensor]  # as exported; `_choose_threshold` may shift the output bias
    losses: list[float]
    hyper: train.Hyper
    seconds: float


@dataclass
class Scores:
    """The network's scores, read back from its file, and the threshold it is used with."""

    score_of: Callable[[torch.Tensor], torch.Tensor]
    held: torch.Tensor  # on the held-out rows
    train: torch.Tensor  # on the training rows
    threshold: float
    aligned_from: float | None  # the chosen threshold, when --align moved it onto the program's
