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
    sim = _Simulation(system, np.random.default_rng(seed), observed)
    sim.decide()
    while sim.committed < warmup + tokens:
        running = sim.advance()
        sim.end_steps(running)
        sim.mark(warmup, tokens / batches)
        sim.decide()
    return sim.result()


class _Simulation:
    """The simulated system's state. Models are indexed 0..K-1 in `system.models` order,
    requests 0..N-1; time is in ms."""

    def __init__(self, system: System, rng: np.random.Generator, observed: dict[str, list[int]] | None):
        M = list(system.models)
        K, N = len(M), system.concurrency
        self.system, self.rng, self.models, self.K, self.N = system, rng, M, K, N
        self.draws = [_RunLengths(rng, system.runlength[m], (observed or {}).get(m)) for m in M]
        self.dests = []  # per model: (destination indices, their probabilities)
        for m in M:
            d = system.dest.get(m, {})
            self.dests.append(([M.index(x) for x in d], np.array(list(d.values()), float)))
        self.rewrite = [[system.is_rewrite(M[i], M[j]) for j in range(K)] for i in range(K)]
        self.B = [system.batch_of(m) for m in M]
        self.max_wait = [system.max_wait_of(m) for m in M]
        self.lat = [[{}, {}] for _ in range(K)]  # cache: model -> co-located? -> batch -> ms

        self.left = [0] * N  # steps left in the current visit
        self.queue = [deque() for _ in range(K)]
        self.batch: list[list[int] | None] = [None] * K
        self.done = [0.0] * K  # fraction of the current step's work done
        self.wait_since = [math.inf] * K
        start_i = M.index(system.start_model)
        for r in range(N):
            self.left[r] = self.draws[start_i].draw()
            self.queue[start_i].append(r)

        self.now, self.committed = 0.0, 0
        # counted once the warm-up is over (t0 set)
        self.t0, self.c0 = None, 0
        self.marks = []  # (time, committed) at batch boundaries, for the confidence interval
        self.busy = [0.0] * K
        self.n_steps, self.n_reqs = [0] * K, [0] * K

    def step_ms(self, i: int, b: int, co: bool) -> float:
        c = self.lat[i][co]
        if b not in c:
            c[b] = self.system.step_ms(self.models[i], b, co)
        return c[b]

    def start(self, i: int) -> None:
        self.batch[i] = list(self.queue[i])
        self.queue[i].clear()
        self.done[i] = 0.0
        self.wait_since[i] = math.inf

    def decide(self) -> None:
        """Start a model's step at B_i ready requests or its max wait, or any model with
        ready requests when none is stepping."""
        batch, queue, wait_since = self.batch, self.queue, self.wait_since
        for i in range(self.K):
            if batch[i] is None and queue[i]:
                if len(queue[i]) >= self.B[i] or self.now >= wait_since[i] + self.max_wait[i] - 1e-9:
                    self.start(i)
                elif wait_since[i] == math.inf:
                    wait_since[i] = self.now
        if all(b is None for b in batch):
            for i in range(self.K):
                if queue[i]:
                    self.start(i)

    def advance(self) -> list[int]:
        """Move time to the next event (a step ending, a max wait expiring); returns the
        models that were stepping."""
        batch, done, max_wait = self.batch, self.done, self.max_wait
        running = [i for i in range(self.K) if batch[i] is not None]
        co = len(running) > 1
        rate = {i: 1.0 / self.step_ms(i, len(batch[i]), co) for i in running}
        dt = min([(1.0 - done[i]) / rate[i] for i in running] +
                 [self.wait_since[i] + max_wait[i] - self.now for i in range(self.K)
                  if batch[i] is None and self.queue[i]])
        dt = max(dt, 0.0)
        self.now += dt
        for i in running:
            done[i] += rate[i] * dt
            if self.t0 is not None:
                self.busy[i] += dt
        return running

    def end_steps(self, running: list[int]) -> None:
        """End the steps whose work is done: each request commits its token (unless a
        handoff rewrites it) and stays, or moves on when its visit is over."""
        left, queue = self.left, self.queue
        for i in running:
            if self.done[i] < 1.0 - 1e-9:
                continue
            reqs, self.batch[i] = self.batch[i], None
            if self.t0 is not None:
                self.n_steps[i] += 1
                self.n_reqs[i] += len(reqs)
            for r in reqs:
                left[r] -= 1
                if left[r] > 0:
                    self.committed += 1
                    queue[i].append(r)
                    continue
                idx, probs = self.dests[i]
                j = idx[0] if len(idx) == 1 else idx[self.rng.choice(len(idx), p=probs)]
                self.committed += 0 if self.rewrite[i][j] else 1
                left[r] = self.draws[j].draw()
                queue[j].append(r)

    def mark(self, warmup: int, every: float) -> None:
        """Start counting once `warmup` tokens are committed; then mark every `every` tokens."""
        if self.t0 is None and self.committed >= warmup:
            self.t0, self.c0 = self.now, self.committed
            self.marks.append((self.now, self.committed))
        elif self.t0 is not None and self.committed - self.marks[-1][1] >= every:
            self.marks.append((self.now, self.committed))

    def result(self) -> SimResult:
        M, N = self.models, self.N
        elapsed = self.now - self.t0
        x = (self.committed - self.c0) / elapsed * 1000.0
        marks = self.marks
        rates = [(c2 - c1) / (t2 - t1) * 1000.0 for (t1, c1), (t2, c2) in zip(marks, marks[1:]) if t2 > t1]
        ci = 1.96 * float(np.std(rates, ddof=1)) / math.sqrt(len(rates)) if len(rates) > 2 else math.inf
        return SimResult(x, ci, N / x * 1000.0, dict(zip(M, self.B)), self.committed - self.c0, elapsed,
                         {m: (self.n_reqs[i] / self.n_steps[i] if self.n_steps[i] else 0.0) for i, m in enumerate(M)},
                         {m: self.busy[i] / elapsed for i, m in enumerate(M)})
