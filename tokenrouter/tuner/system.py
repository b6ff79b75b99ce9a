"""The system both the chain and the simulator model, as plain data.

N requests in a closed loop, a few models each with a step-latency curve from the
profile, per-model run lengths (geometric or phase-type) and where a request goes when
its run ends, whether the token that triggered a handoff is kept or rewritten, and the
delayed-batching schedule (threshold B_i and max wait per model). No behaviour lives
here: the chain (dtmc.py) and the simulator (simulate.py) each implement the rules on
their own, so that agreeing with each other means something.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tokenrouter.tuner.errors import TuneError
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.runlength import PhaseType, RunLengthError


class InvalidSystem(TuneError):
    """An inconsistent system description (bad probabilities, unknown model, ...)."""


@dataclass(frozen=True)
class System:
    profile: Profile
    models: tuple[str, ...]
    concurrency: int
    #: per model, its run-length distribution (steps per visit)
    runlength: dict[str, PhaseType]
    #: per model, where a request goes when its run ends: {dest: probability}
    dest: dict[str, dict[str, float]]
    #: (source, dest) -> True when the triggering token is rewritten (not committed)
    rewrite: dict[tuple[str, str], bool] = field(default_factory=dict)
    start: str = ""
    batch: dict[str, int] = field(default_factory=dict)
    max_wait_ms: dict[str, float] = field(default_factory=dict)
    #: False: models on independent hardware, a step never slows another
    colocated: bool = True
    #: per model, mean tokens a request feeds per step (1: decodes). A request arriving at
    #: a model catches up on what the others wrote meanwhile (an extend), see `two_models`.
    tokens_per_step: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise InvalidSystem(f"concurrency must be >= 1, got {self.concurrency}")
        if len(self.models) < 1 or len(set(self.models)) != len(self.models):
            raise InvalidSystem("models must be distinct and at least one")
        for m in self.models:
            self.profile[m]  # raises a clear error when the profile lacks it
            if m not in self.runlength:
                raise InvalidSystem(f"no run-length distribution for model {m!r}")
            d = self.dest.get(m, {})
            if len(self.models) > 1:
                if any(k not in self.models or k == m for k in d) or abs(sum(d.values()) - 1) > 1e-9 \
                        or any(v < 0 for v in d.values()):
                    raise InvalidSystem(f"destinations of {m!r} must be other models with probabilities "
                                       f"summing to 1, got {d}")
            if self.batch_of(m) < 1:
                raise InvalidSystem(f"batch threshold of {m!r} must be >= 1")
        if self.start and self.start not in self.models:
            raise InvalidSystem(f"start model {self.start!r} is not one of {self.models}")

    # ------------------------------------------------------------ helpers
    @property
    def start_model(self) -> str:
        return self.start or self.models[0]

    def batch_of(self, m: str) -> int:
        return int(self.batch.get(m, 1))

    def max_wait_of(self, m: str) -> float:
        return float(self.max_wait_ms.get(m, math.inf))

    def is_rewrite(self, src: str, dst: str) -> bool:
        return bool(self.rewrite.get((src, dst), False))

    def step_ms(self, m: str, b: int, co_located: bool) -> float:
        return self.profile.step_ms(m, b, co_located and self.colocated, self.tokens_per_step.get(m, 1.0))

    def with_batch(self, batch: dict[str, int]) -> "System":
        return replace(self, batch={**self.batch, **batch})

    def with_runlength(self, runlength: dict[str, PhaseType]) -> "System":
        rl = {**self.runlength, **runlength}
        return replace(self, runlength=rl, tokens_per_step=pair_tokens_per_step(self.models, rl))

    # --------------------------------------------------------- constructors
    @staticmethod
    def two_models(profile: Profile, small: str, large: str, concurrency: int, p_small_to_large: float,
                   p_large_to_small: float, *, rewrite: bool = True, batch: dict[str, int] | None = None,
                   max_wait_ms: dict[str, float] | None = None, colocated: bool = True,
                   runlength: dict[str, PhaseType] | None = None) -> "System":
        """The usual pair: `small` starts every request and hands off to `large` with
        probability p_small_to_large per token (its token rewritten when `rewrite`);
        `large` hands back with p_large_to_small, keeping its token."""
        try:
            rl = {small: PhaseType.geometric(p_small_to_large), large: PhaseType.geometric(p_large_to_small)}
        except RunLengthError as exc:
            raise InvalidSystem(str(exc)) from None
        rl.update(runlength or {})
        return System(profile, (small, large), concurrency, rl, {small: {large: 1.0}, large: {small: 1.0}},
                      {(small, large): rewrite, (large, small): False}, small, dict(batch or {}),
                      dict(max_wait_ms or {}), colocated, pair_tokens_per_step((small, large), rl))


def pair_tokens_per_step(models: tuple[str, ...], runlength: dict[str, PhaseType]) -> dict[str, float]:
    """Mean tokens fed per request-step at each of two alternating models. A visit of mean
    r_m steps starts by feeding what the other model wrote since this one last saw the
    request, about its run r_o (its committed tokens, plus this model's own last token or
    minus a rewritten one), then decodes: k_m = (r_o + (r_m - 1)) / r_m."""
    if len(models) != 2:
        return {}
    a, b = models
    ra, rb = runlength[a].mean(), runlength[b].mean()
    return {a: (rb + ra - 1) / ra, b: (ra + rb - 1) / rb}
