"""The tuner's entry points: predict the throughput curve over B and pick the best.

    from tokenrouter.tuner.api import choose_batch_thresholds
    choose_batch_thresholds(profile, concurrency=8, route_probs=(0.1, 1.0))  # {"slm": 1, "llm": 4}

Predictions come from the Markov chain for N <= 24 when its state space fits the budget,
and from the discrete-event simulator beyond that, so every N up to 64 gets an answer
in seconds; each curve point says which method produced it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tokenrouter.tuner import dtmc, simulate
from tokenrouter.tuner.bounds import upper_bound
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.runlength import PhaseType, fit
from tokenrouter.tuner.errors import TuneError
from tokenrouter.tuner.system import InvalidSystem, System, pair_tokens_per_step

#: `auto` uses the chain up to this concurrency (seconds per B on 2 cores), the
#: simulator above (a tenth of a second per B; the chain would take 10-20 s per B or
#: not fit its state budget at N = 64).
AUTO_CHAIN_MAX_N = 24


@dataclass
class Point:
    batch: dict[str, int]
    throughput: float
    latency_ms_per_token: float
    method: str  # "chain" or "simulation"
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "throughput": self.throughput,
                "latency_ms_per_token": self.latency_ms_per_token, "method": self.method, **self.detail}


@dataclass
class TuneResult:
    searched: str  # the model whose threshold was searched
    best: Point
    curve: list[Point]
    upper_bound: float
    concurrency: int
    runlengths: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "searched": self.searched, "best": self.best.to_dict(),
                "upper_bound": self.upper_bound, "runlengths": self.runlengths,
                "curve": [p.to_dict() for p in self.curve]}


def route_table(models: Sequence[str], route_probs) -> dict[str, dict[str, float]]:
    """Normalise routing probabilities to {src: {dst: p per token}}. Accepts that form,
    {src: p} (two models: to the other one), or (p_first_to_second, p_second_to_first)."""
    models = list(models)
    if isinstance(route_probs, Mapping):
        out = {}
        for src, v in route_probs.items():
            if src not in models:
                raise InvalidSystem(f"routing probabilities name an unknown model {src!r}")
            if isinstance(v, Mapping):
                out[src] = {d: float(p) for d, p in v.items()}
            else:
                if len(models) != 2:
                    raise InvalidSystem("with more than two models give {src: {dst: p}}")
                out[src] = {next(m for m in models if m != src): float(v)}
        return out
    probs = list(route_probs)
    if len(models) != 2 or len(probs) != 2:
        raise InvalidSystem("a pair of routing probabilities needs exactly two models")
    return {models[0]: {models[1]: float(probs[0])}, models[1]: {models[0]: float(probs[1])}}


def build_system(profile: Profile, concurrency: int, route_probs=None, runlengths=None, *,
                 models: Sequence[str] | None = None, start: str | None = None,
                 rewrite: Mapping[tuple[str, str], bool] | None = None,
                 batch: Mapping[str, int] | None = None, max_wait_ms: Mapping[str, float] | None = None,
                 colocated: bool = True) -> System:
    """A `System` from the tuner's user-facing inputs. A model's run lengths come from
    `runlengths` (a PhaseType, or a list of observed run lengths to fit) when given, else
    are geometric with its total switching probability from `route_probs`."""
    models = list(models or profile.models)
    table = route_table(models, route_probs) if route_probs is not None else {}
    rl, dest = {}, {}
    for m in models:
        out = {d: p for d, p in table.get(m, {}).items() if p > 0}
        for d, p in out.items():
            if d not in models or d == m:
                raise InvalidSystem(f"routing from {m!r} to {d!r}: not another model of the profile")
            if not 0 <= p <= 1:
                raise InvalidSystem(f"routing probability {m}->{d} must be in [0, 1], got {p}")
        total = sum(out.values())
        if total > 1 + 1e-9:
            raise InvalidSystem(f"routing probabilities out of {m!r} sum to {total:g} > 1")
        given = (runlengths or {}).get(m)
        if given is not None:
            rl[m] = given if isinstance(given, PhaseType) else fit(given)
        elif m in table or len(models) == 1:
            rl[m] = PhaseType.geometric(total)
        else:
            raise InvalidSystem(f"no routing probability and no run lengths for model {m!r}")
        if out:
            dest[m] = {d: p / total for d, p in out.items()}
        elif len(models) == 2:
            dest[m] = {next(x for x in models if x != m): 1.0}
        else:
            dest[m] = {}
    return System(profile, tuple(models), int(concurrency), rl, dest, dict(rewrite or {}),
                  start or models[0], dict(batch or {}), dict(max_wait_ms or {}), colocated,
                  pair_tokens_per_step(tuple(models), rl))


def predict(system: System, method: str = "auto", *, sim_tokens: int = 100_000, seed: int = 0,
            max_states: int = dtmc.DEFAULT_MAX_STATES) -> Point:
    """Throughput and latency of one schedule, by the chain (or the simulator when the
    chain is too large, or when asked)."""
    batch = {m: system.batch_of(m) for m in system.models}
    if method == "chain" or (method == "auto" and system.concurrency <= AUTO_CHAIN_MAX_N):
        try:
            r = dtmc.solve(system, max_states=max_states)
            return Point(batch, r.throughput, r.latency_ms_per_token, "chain",
                         {"states": r.states, "tick_ms": r.tick_ms, "mean_batch": r.mean_batch,
                          "utilisation": r.utilisation})
        except dtmc.ChainTooLarge:
            if method == "chain":
                raise
    r = simulate.simulate(system, tokens=sim_tokens, seed=seed)
    return Point(batch, r.throughput, r.latency_ms_per_token, "simulation",
                 {"ci95": r.ci95, "mean_batch": r.mean_batch, "utilisation": r.utilisation})


def default_candidates(concurrency: int) -> list[int]:
    """Every B up to 16, then a coarser grid up to N (the curve is flat near its top)."""
    if concurrency <= 16:
        return list(range(1, concurrency + 1))
    grid = list(range(1, 9)) + [10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64]
    return sorted({b for b in grid if b <= concurrency} | {concurrency})


def slowest(system: System) -> str:
    return max(system.models, key=lambda m: system.step_ms(m, 1, False))


def tune(system: System, *, model: str | None = None, candidates: Sequence[int] | None = None,
         method: str = "auto", progress=None) -> TuneResult:
    """Predict the curve over B for `model` (default: the slowest), others as given."""
    model = model or slowest(system)
    if model not in system.models:
        raise InvalidSystem(f"cannot tune unknown model {model!r}")
    cands = list(candidates or default_candidates(system.concurrency))
    if any(b < 1 for b in cands):
        raise InvalidSystem("batch thresholds must be >= 1")
    curve = []
    for b in cands:
        curve.append(predict(system.with_batch({model: int(b)}), method))
        if progress:
            progress(b, curve[-1])
    best = max(curve, key=lambda p: p.throughput)
    rls = {m: system.runlength[m].to_dict() for m in system.models}
    return TuneResult(model, best, curve, upper_bound(system), system.concurrency, rls)


def choose_batch_thresholds(profile: Profile, concurrency: int, route_probs=None, runlengths=None,
                            **system_options) -> dict[str, int]:
    """B_i per model: the slowest model's threshold maximising predicted committed
    tokens per second, every other model 1. `route_probs`: see `route_table`;
    `runlengths`: {model: PhaseType or observed run lengths}; `system_options`:
    keyword arguments of `build_system` (models, start, rewrite, max_wait_ms, colocated)."""
    system = build_system(profile, concurrency, route_probs, runlengths, **system_options)
    result = tune(system)
    return {m: result.best.batch.get(m, 1) for m in system.models}
