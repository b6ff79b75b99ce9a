"""An upper bound on throughput from the profile alone.

Every step runs at its cheapest per-request cost (the batch size b <= N minimising
L_i(b) / b, i.e. fully batched), nothing ever waits, and the models overlap as well as
co-location allows: a linear program over how long each set of models steps together
(while others step, a model's work runs 1 + c times slower). Measured or predicted
throughput can be quoted as a fraction of it.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np
from scipy.optimize import linprog

from tokenrouter.tuner.system import System


def step_shares(system: System) -> tuple[dict[str, float], float]:
    """(share of request-steps on each model, committed tokens per request-step)."""
    M = list(system.models)
    means = {m: system.runlength[m].mean() for m in M}
    start = system.start_model
    if math.isinf(means[start]) or len(M) == 1:
        return {m: float(m == start) for m in M}, 1.0
    D = np.array([[system.dest.get(a, {}).get(b, 0.0) for b in M] for a in M])
    # visit frequencies: stationary vector of the model-to-model visit chain
    w, v = np.linalg.eig(D.T)
    visits = np.real(v[:, np.argmin(np.abs(w - 1))])
    visits = np.abs(visits) / np.abs(visits).sum()
    steps = np.array([visits[i] * means[m] for i, m in enumerate(M)])
    rewritten = np.array([visits[i] * sum(D[i, j] * system.is_rewrite(m, M[j]) for j in range(len(M)))
                          for i, m in enumerate(M)])
    if not np.isfinite(steps).all():
        raise ValueError("a model other than the start model never hands back; the bound is undefined")
    return {m: float(steps[i] / steps.sum()) for i, m in enumerate(M)}, float(1 - rewritten.sum() / steps.sum())


def upper_bound(system: System) -> float:
    """Committed tokens per second no schedule can beat on this profile."""
    N = system.concurrency
    share, commit = step_shares(system)
    work, slow = {}, {}
    for m in system.models:
        per_step, slow[m] = cheapest_step(lambda b, co, m=m: system.step_ms(m, b, co), N)
        work[m] = share[m] * per_step  # ms per request-step
    return commit / overlapped_ms(work, slow) * 1000.0


def cheapest_step(step_ms: Callable[[int, bool], float], concurrency: int) -> tuple[float, float]:
    """(ms per request of a step at the batch b <= N that minimises L(b) / b, and how much
    slower that step runs while another model steps: L_co(b) / L(b))."""
    best_b = min(range(1, concurrency + 1), key=lambda b: step_ms(b, False) / b)
    alone = step_ms(best_b, False)
    return alone / best_b, step_ms(best_b, True) / alone


def overlapped_ms(work: dict[str, float], slow: dict[str, float]) -> float:
    """The least time in which every model gets its `work` (ms of steps alone) done, models
    stepping together as co-location allows: a linear program over how long each set of
    models steps together, a model's work running `slow` times slower while others step."""
    active = [m for m in work if work[m] > 0]
    subsets = [s for k in range(1, len(active) + 1) for s in itertools.combinations(active, k)]
    # minimise total time sum_S t_S such that each model's work gets done
    A = np.array([[-(1.0 if len(s) == 1 else 1.0 / slow[m]) * (m in s) for s in subsets] for m in active])
    res = linprog(np.ones(len(subsets)), A_ub=A, b_ub=-np.array([work[m] for m in active]), bounds=(0, None))
    if not res.success:
        raise RuntimeError(f"bound LP failed: {res.message}")
    return float(res.fun)
