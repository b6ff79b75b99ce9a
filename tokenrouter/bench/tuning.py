"""The tuned B_i and the tuner's predictions for the benchmark.

B_i come from the same calls `tokenrouter serve --profile` makes for `batch X = auto`
(`tuner.program.auto_thresholds`, handed to `runtime.launch.batch_thresholds`), so the bench
runs exactly what the server would. The profile is read from `--profile` or measured
here once (`tuner.measure.measure_profile`, the code behind `tokenrouter profile`).
Predictions (`tuner.api.predict`) are kept next to the measurements so the report can
say how far the chain is from the runtime.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tokenrouter.runtime.launch import batch_thresholds, served_writers
from tokenrouter.tuner import api
from tokenrouter.tuner.measure import measure_profile
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.program import auto_thresholds, inputs_from_program


def profile_batch_sizes(max_concurrency: int) -> list[int]:
    """Powers of two up to the largest concurrency (the tuner refuses to extrapolate
    past 4x the largest measured size, so this always covers every level)."""
    out, b = [], 1
    while b < max_concurrency:
        out.append(b)
        b *= 2
    return out + [max(1, max_concurrency)]


def load_or_measure(program, path: str | None, max_concurrency: int, repeats: int, progress: bool, source: str):
    if path:
        return Profile.load(path)
    return measure_profile(program, profile_batch_sizes(max_concurrency), repeats=repeats, progress=progress,
                           source=source)


def tuned_thresholds(program, concurrency: int, profile) -> dict[str, int]:
    writers = served_writers(program)
    return batch_thresholds(program, writers, concurrency,
                            tuned=auto_thresholds(program, profile, concurrency, writers))


def predict(program, profile, concurrency: int, batch: dict[str, int], prompt_tokens: float = 0.0,
            request_tokens: float = 0.0) -> dict[str, Any] | None:
    """The tuner's predicted tokens/s for this schedule, or None when the program does
    not fix its routing probabilities (then they must be measured first). With the
    workload's mean prompt and request lengths, each request's prompt prefills are counted
    too (`with_prefills`: the chain's own steps feed only decodes and extends), so the
    prediction prices the work the measurement does, as `results.bound` does."""
    try:
        pi = inputs_from_program(program)
        if not set(pi.route_probs) >= set(pi.models):
            return None
        system = api.build_system(profile, concurrency, pi.route_probs, models=pi.models, start=pi.start,
                                  rewrite=pi.rewrite, batch=batch, max_wait_ms=pi.max_wait_ms)
        if prompt_tokens > 0 and request_tokens > 0:
            system = with_prefills(system, prompt_tokens, request_tokens)
        p = api.predict(system)
    except api.TuneError as exc:
        return {"error": str(exc)}
    return {"tokens_per_s": p.throughput, "method": p.method, "batch": p.batch,
            "tokens_per_request_step": dict(system.tokens_per_step),
            "prefills_counted": prompt_tokens > 0 and request_tokens > 0}


def with_prefills(system, prompt_tokens: float, request_tokens: float):
    """`system` with what a finite request feeds each model of a pair, spread over that
    model's request-steps. A cycle of the two models' mean runs r_a, r_b commits r_a + r_b
    tokens less the rewritten ones, so model m takes r_m / cycle request-steps per committed
    token, and its steady-state k_m feeds it about each committed token once. A request of R
    tokens and a prompt of P adds the prompt, fed once on m's first visit: (P / R) cycle / r_m
    more per request-step. It also ends before m sees its last tokens: with probability
    r_o / cycle it ends in the other model's run, about r_o tokens old (its mean, as for
    geometric runs), which m is never fed, so m's steady-state feeding shrinks by
    1 - tail_m / R with tail_m = min(R, r_o^2 / cycle). On the benchmark pair (R = 128, P = 16)
    that is 19.4 tokens a large-model step, as the runtime counted, where the steady state
    and the prompt alone said 22.5. Other systems unchanged."""
    if len(system.models) != 2:
        return system
    a, b = system.models
    r = {m: system.runlength[m].mean() for m in system.models}
    cycle = r[a] + r[b] - system.is_rewrite(a, b) - system.is_rewrite(b, a)
    share = prompt_tokens / request_tokens
    k = {}
    for m, o in ((a, b), (b, a)):
        tail = min(request_tokens, r[o] * r[o] / cycle)
        k[m] = system.tokens_per_step.get(m, 1.0) * (1 - tail / request_tokens) + share * cycle / r[m]
    return dataclasses.replace(system, tokens_per_step=k)


def sweep_candidates(concurrency: int, tuned: int) -> list[int]:
    """Thresholds for the measured sweep: 1, 2, 3, 4, 6, 8, ... up to N, plus the tuned one."""
    out = {1, tuned}
    b = 2
    while b <= concurrency:
        out.add(b)
        out.add(min(concurrency, b + b // 2))
        b *= 2
    return sorted(x for x in out if 1 <= x <= max(1, concurrency))


def slowdown_summary(profile) -> dict[str, Any]:
    """Per model: batch-1 step time alone and co-located, and the slowdown c."""
    out = {}
    for name, m in profile.models.items():
        alone = m.step_ms(1)
        co = m.step_ms(1, True) if m.co_located else math.nan
        out[name] = {"alone_ms_b1": alone, "co_located_ms_b1": co,
                     "c_b1": (co / alone - 1) if m.co_located else None,
                     "batch_sizes": list(m.alone.batch_sizes), "alone_ms": list(m.alone.ms),
                     "co_located_ms": list(m.co_located.ms) if m.co_located else None}
    return out
