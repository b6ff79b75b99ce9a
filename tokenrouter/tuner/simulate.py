"""A discrete-event simulator of the routed system, independent of the Markov chain.

Continuous time, exact step times: a step of b requests on model i needs one unit of
work done at rate 1 / L_i(b) per ms while it is the only model stepping, and at rate
1 / L_i^co(b) while another model steps too (the rates change when the set of stepping
models changes). A request draws, on arriving at a model, how many steps it will take
there (geometric, phase-type, or drawn from a list of observed run lengths), and counts
them down. Start rules as in docs/tuner.md: start at B_i ready requests, at the max
wait, or when no model is stepping.

It shares with the chain only the inputs (profile, system description); it is what the
chain is checked against, and what handles empirical run lengths directly.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tokenrouter.tuner.runlength import PhaseType
from tokenrouter.tuner.system import System


@dataclass
class SimResult:
    throughput: float  # committed tokens per second, after warm-up
    ci95: float  # half-width of a 95% confidence interval (batch means)
    latency_ms_per_token: float
    batch: dict[str, int]
    tokens: int
    sim_ms: float
    mean_batch: dict[str, float] = field(default_factory=dict)
    utilisation: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _RunLengths:
    """Draws run lengths for one model, in blocks for speed."""

    def __init__(self, rng: np.random.Generator, dist: PhaseType | None = None, observed=None):
        self.rng, self.buf, self.pos = rng, np.empty(0, int), 0
        if observed is not None:
            self.obs = np.asarray(observed, int)
            self.kind = "observed"
        elif dist.phases == 1:
            self.p = 1.0 - dist.T[0][0]
            self.kind = "never" if self.p <= 0 else "geometric"
        else:
            self.dist = dist
            self.alpha = np.asarray(dist.alpha)
            self.T = np.asarray(dist.T)
            self.kind = "phase"

    def _block(self, n: int) -> np.ndarray:
        if self.kind == "observed":
            return self.rng.choice(self.obs, size=n)
        if self.kind == "geometric":
            return self.rng.geometric(self.p, size=n)
        if self.kind == "never":
            return np.full(n, np.iinfo(np.int64).max // 4)
        # walk the phases: a geometric stay in each, then a jump to another phase or out
        out = np.empty(n, int)
        P = self.T.shape[0]
        exit_ = np.clip(1 - self.T.sum(1), 0, 1)
        for k in range(n):
            f, total = self.rng.choice(P, p=self.alpha), 0
            while True:
                stay = self.T[f, f]
                if stay >= 1:
                    total = np.iinfo(np.int64).max // 4
                    break
                total += self.rng.geometric(1 - stay)
                jump = np.append(self.T[f], exit_[f])
                jump[f] = 0
                g = self.rng.choice(P + 1, p=jump / jump.sum())
                if g == P:
                    break
                f = g
            out[k] = total
        return out

    def draw(self) -> int:
        if self.pos >= len(self.buf):
            self.buf, self.pos = self._block(4096), 0
        self.pos += 1
        return int(self.buf[self.pos - 1])


def simulate(system: System, *, tokens: int = 200_000, warmup: int = 5_000, seed: int = 0,
             observed: dict[str, list[int]] | None = None, batches: int = 20) -> SimResult:
    """Simulate until `tokens` tokens are committed after `warmup`; `observed` replaces a
    model's run-length distribution by draws from its list of observed run lengths."""
    rng = np.random.default_rng(seed)
    M = list(system.models)
    K, N = len(M), system.concurrency
    draws = [_RunLengths(rng, system.runlength[m], (observed or {}).get(m)) for m in M]
    dests = []
    for m in M:
        d = system.dest.get(m, {})
        dests.append(([M.index(x) for x in d], np.array(list(d.values()), float)))
    rewrite = [[system.is_rewrite(M[i], M[j]) for j in range(K)] for i in range(K)]
    B = [system.batch_of(m) for m in M]
    max_wait = [system.max_wait_of(m) for m in M]
    lat = [[{}, {}] for _ in range(K)]  # cache: model -> co-located? -> batch -> ms

    def step_ms(i: int, b: int, co: bool) -> float:
        c = lat[i][co]
        if b not in c:
            c[b] = system.step_ms(M[i], b, co)
        return c[b]

    left = [0] * N  # steps left in the current visit
    queue = [deque() for _ in range(K)]
    batch: list[list[int] | None] = [None] * K
    done = [0.0] * K  # fraction of the current step's work done
    wait_since = [math.inf] * K
    start_i = M.index(system.start_model)
    for r in range(N):
        left[r] = draws[start_i].draw()
        queue[start_i].append(r)

    now, committed = 0.0, 0
    t0, c0 = None, 0
    marks = []  # (time, committed) at batch boundaries, for the confidence interval
    busy = [0.0] * K
    n_steps, n_reqs = [0] * K, [0] * K
    target = warmup + tokens

    def start(i: int) -> None:
        batch[i] = list(queue[i])
        queue[i].clear()
        done[i] = 0.0
        wait_since[i] = math.inf

    def decide() -> None:
        for i in range(K):
            if batch[i] is None and queue[i]:
                if len(queue[i]) >= B[i] or now >= wait_since[i] + max_wait[i] - 1e-9:
                    start(i)
                elif wait_since[i] == math.inf:
                    wait_since[i] = now
        if all(b is None for b in batch):
            for i in range(K):
                if queue[i]:
                    start(i)

    decide()
    while committed < target:
        running = [i for i in range(K) if batch[i] is not None]
        co = len(running) > 1
        rate = {i: 1.0 / step_ms(i, len(batch[i]), co) for i in running}
        dt = min([(1.0 - done[i]) / rate[i] for i in running] +
                 [wait_since[i] + max_wait[i] - now for i in range(K) if batch[i] is None and queue[i]])
        dt = max(dt, 0.0)
        now += dt
        for i in running:
            done[i] += rate[i] * dt
            if t0 is not None:
                busy[i] += dt
        for i in running:
            if done[i] < 1.0 - 1e-9:
                continue
            reqs, batch[i] = batch[i], None
            if t0 is not None:
                n_steps[i] += 1
                n_reqs[i] += len(reqs)
            for r in reqs:
                left[r] -= 1
                if left[r] > 0:
                    committed += 1
                    queue[i].append(r)
                    continue
                idx, probs = dests[i]
                j = idx[0] if len(idx) == 1 else idx[rng.choice(len(idx), p=probs)]
                committed += 0 if rewrite[i][j] else 1
                left[r] = draws[j].draw()
                queue[j].append(r)
        if t0 is None and committed >= warmup:
            t0, c0 = now, committed
            marks.append((now, committed))
        elif t0 is not None and committed - marks[-1][1] >= tokens / batches:
            marks.append((now, committed))
        decide()

    elapsed = now - t0
    x = (committed - c0) / elapsed * 1000.0
    rates = [(c2 - c1) / (t2 - t1) * 1000.0 for (t1, c1), (t2, c2) in zip(marks, marks[1:]) if t2 > t1]
    ci = 1.96 * float(np.std(rates, ddof=1)) / math.sqrt(len(rates)) if len(rates) > 2 else math.inf
    return SimResult(x, ci, N / x * 1000.0, dict(zip(M, B)), committed - c0, elapsed,
                     {m: (n_reqs[i] / n_steps[i] if n_steps[i] else 0.0) for i, m in enumerate(M)},
                     {m: busy[i] / elapsed for i, m in enumerate(M)})
