"""The discrete-time Markov chain of a routed system, and its stationary throughput.

Time advances in ticks of `tick_ms`. A state records, per model: the ready requests
(counted per run-length phase), the requests in its current step (per phase), the
step's remaining work in ticks, and how long it has waited for a batch to fill. During a
tick each stepping model does one tick of work, or, while another model also steps on
the same cores, does it with probability L_alone(b) / L_colocated(b) (so the expected
step time is right). A step's work is L(b) / tick_ms ticks, rounded up or down at random
with the mean kept. When a step ends each of its requests, independently, moves to its
next phase, or ends its run and goes to another model (arriving in that model's initial
phase). Then every idle model with ready requests decides: start when at least B_i are
ready, when it has waited its max wait, or when no model is stepping (nothing more can
arrive, so waiting would deadlock). docs/tuner.md spells the construction out.

Throughput = sum over states of pi(s) * E[tokens committed in the next tick | s] / tick.
A step's request commits a token unless its run ends with a `rewrite` handoff.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from tokenrouter.tuner.system import System

DEFAULT_MAX_STATES = 30_000


class ChainTooLarge(RuntimeError):
    """The state space exceeded the budget at every resolution tried."""


@dataclass
class ChainResult:
    throughput: float  # committed tokens per second
    latency_ms_per_token: float  # mean time between one request's committed tokens: N / throughput
    batch: dict[str, int]
    states: int
    transitions: int
    tick_ms: float
    utilisation: dict[str, float] = field(default_factory=dict)  # fraction of time stepping
    mean_batch: dict[str, float] = field(default_factory=dict)  # requests per step
    steps_per_s: dict[str, float] = field(default_factory=dict)
    stationary: np.ndarray | None = field(default=None, repr=False)
    resolution: int = 0  # ticks per batch-1 step of the fastest model

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "stationary"}


def _multinomial(n: int, probs: tuple[float, ...]):
    """All ways to split n items over categories with `probs`: [(prob, counts)]."""
    if len(probs) == 1:
        return [(1.0, (n,))] if probs[0] > 0 or n == 0 else []
    head, rest = probs[0], sum(probs[1:])
    out = []
    for k in range(n + 1):
        if head == 0 and k > 0:
            break
        pk = math.comb(n, k) * head ** k * rest ** (n - k) if rest > 0 else (1.0 if k == n else 0.0)
        if pk == 0:
            continue
        sub = tuple(p / rest for p in probs[1:]) if rest > 0 else tuple(0.0 for _ in probs[1:])
        for q, counts in (_multinomial(n - k, sub) if n - k > 0 else [(1.0, (0,) * (len(probs) - 1))]):
            out.append((pk * q, (k,) + counts))
    return out


class ChainBuilder:
    """Enumerates the reachable states and their transition probabilities."""

    def __init__(self, system: System, tick_ms: float, max_states: int):
        self.s, self.tick, self.max_states = system, tick_ms, max_states
        self.M = list(system.models)
        self.K = len(self.M)
        self.N = system.concurrency
        self.rl = [system.runlength[m] for m in self.M]
        self.P = [d.phases for d in self.rl]
        self.alpha = [np.asarray(d.alpha, float) for d in self.rl]
        self.T = [np.asarray(d.T, float) for d in self.rl]
        self.exit = [d.exit for d in self.rl]
        self.B = [system.batch_of(m) for m in self.M]
        self.wait_ticks = []
        for m in self.M:
            w = system.max_wait_of(m)
            self.wait_ticks.append(None if math.isinf(w) else max(0, math.ceil(w / tick_ms - 1e-9)))
        # categories a request in phase f of model i can go to after a step:
        # ("stay", phase) or ("go", j, phase of j); and whether it commits its token
        self.cats = []
        for i, m in enumerate(self.M):
            per_phase = []
            for f in range(self.P[i]):
                cs = [(float(self.T[i][f, g]), ("stay", g)) for g in range(self.P[i])]
                for j, mj in enumerate(self.M):
                    d = system.dest.get(m, {}).get(mj, 0.0)
                    if j == i or d == 0:
                        continue
                    cs += [(float(self.exit[i][f] * d * self.alpha[j][g]), ("go", j, g)) for g in range(self.P[j])]
                per_phase.append([c for c in cs if c[0] > 0])
            self.cats.append(per_phase)
        self.commit_rate = []  # per model and phase: P(the step's token is committed)
        for i, m in enumerate(self.M):
            rw = sum(system.dest.get(m, {}).get(mj, 0.0) * system.is_rewrite(m, mj) for mj in self.M if mj != m)
            self.commit_rate.append([1.0 - self.exit[i][f] * rw for f in range(self.P[i])])
        self._work = lru_cache(None)(self._work_uncached)
        self._adv = lru_cache(None)(self._adv_uncached)
        self._end = lru_cache(None)(self._end_uncached)

    # ---------------------------------------------------------------- pieces
    def _work_uncached(self, i: int, b: int):
        """Ticks of work of a step of b requests: [(prob, ticks)], mean L(b)/tick."""
        w = self.s.step_ms(self.M[i], b, False) / self.tick
        lo = math.floor(w)
        frac = w - lo
        if lo < 1:
            return ((1.0, 1),)
        if frac < 1e-9:
            return ((1.0, lo),)
        return ((1.0 - frac, lo), (frac, lo + 1))

    def _adv_uncached(self, i: int, b: int, co: bool) -> float:
        if not co:
            return 1.0
        return self.s.step_ms(self.M[i], b, False) / self.s.step_ms(self.M[i], b, True)

    def _end_uncached(self, i: int, step: tuple[int, ...]):
        """Outcomes of a finished step: [(prob, stay vector, arrivals per model)]."""
        acc = {(): 1.0}
        for f, n in enumerate(step):
            if n == 0:
                continue
            cats = self.cats[i][f]
            outs = _multinomial(n, tuple(c[0] for c in cats))
            new = defaultdict(float)
            for key, p in acc.items():
                for q, counts in outs:
                    moves = list(key)
                    for (_, cat), k in zip(cats, counts):
                        if k:
                            moves.append((cat, k))
                    new[tuple(sorted(moves))] += p * q
            acc = new
        result = []
        for key, p in acc.items():
            stay = [0] * self.P[i]
            arr = [[0] * self.P[j] for j in range(self.K)]
            for cat, k in key:
                if cat[0] == "stay":
                    stay[cat[1]] += k
                else:
                    arr[cat[1]][cat[2]] += k
            result.append((p, tuple(stay), tuple(tuple(a) for a in arr)))
        return tuple(result)

    def commit(self, i: int, step: tuple[int, ...]) -> float:
        return sum(n * self.commit_rate[i][f] for f, n in enumerate(step))

    # ------------------------------------------------------------ transitions
    def initial(self):
        zero = [tuple([0] * p) for p in self.P]
        i0 = self.M.index(self.s.start_model)
        q = list(zero)
        q[i0] = tuple(self.N if f == 0 else 0 for f in range(self.P[i0]))
        model = [(q[i], zero[i], 0, 0) for i in range(self.K)]
        return next(iter(self._decide(model, [False] * self.K)))[1]

    def _decide(self, model, was_waiting):
        """Apply the start rules to per-model (queued, step, r, w) after a tick's events.
        Yields (prob, state)."""
        starting, waits = [], list(w for (_, _, _, w) in model)
        for i, (q, step, r, w) in enumerate(model):
            if r > 0 or sum(q) == 0:
                waits[i] = 0
                continue
            n = sum(q)
            nw = w + 1 if was_waiting[i] else 0
            wt = self.wait_ticks[i]
            if n >= self.B[i] or (wt is not None and nw >= wt):
                starting.append(i)
            else:
                waits[i] = nw if wt is not None else 0
        if not starting and all(r == 0 for (_, _, r, _) in model):
            starting = [i for i, (q, _, _, _) in enumerate(model) if sum(q) > 0]
        branches = [(1.0, list(model))]
        for i in starting:
            q = model[i][0]
            zero = tuple([0] * self.P[i])
            nxt = []
            for p, mod in branches:
                for pw, ticks in self._work(i, sum(q)):
                    m2 = list(mod)
                    m2[i] = (zero, q, ticks, 0)
                    nxt.append((p * pw, m2))
            branches = nxt
        for p, mod in branches:
            yield p, tuple((q, step, r, (waits[i] if r == 0 else 0)) for i, (q, step, r, _) in enumerate(mod))

    def successors(self, state):
        """[(prob, next state)] and the expected tokens committed in this tick."""
        stepping = [st[2] > 0 for st in state]
        n_step = sum(stepping)
        per_model, reward = [], 0.0
        for i, (q, step, r, w) in enumerate(state):
            if r == 0:
                per_model.append([(1.0, ("idle",))])
                continue
            adv = self._adv(i, sum(step), n_step > 1)
            outs = []
            if r > 1:
                outs.append((adv, ("run", r - 1)))
            else:
                reward += adv * self.commit(i, step)
                for p, stay, arr in self._end(i, step):
                    outs.append((adv * p, ("end", stay, arr)))
            if adv < 1:
                outs.append((1 - adv, ("run", r)))
            per_model.append(outs)
        acc = defaultdict(float)
        combos = [(1.0, [])]
        for outs in per_model:
            combos = [(p * q, ev + [o]) for p, ev in combos for q, o in outs]
        for p, events in combos:
            queued = [list(st[0]) for st in state]
            model = []
            for i, ev in enumerate(events):
                if ev[0] == "end":
                    for j, a in enumerate(ev[2]):
                        for g, k in enumerate(a):
                            queued[j][g] += k
                    for g, k in enumerate(ev[1]):
                        queued[i][g] += k
            for i, ev in enumerate(events):
                q, step, r, w = state[i]
                if ev[0] == "run":
                    model.append((tuple(queued[i]), step, ev[1], 0))
                else:
                    model.append((tuple(queued[i]), tuple([0] * self.P[i]), 0, w))
            was_waiting = [state[i][2] == 0 and sum(state[i][0]) > 0 for i in range(self.K)]
            for pd, nxt in self._decide(model, was_waiting):
                acc[nxt] += p * pd
        return list(acc.items()), reward

    def build(self):
        """(states, P, rewards, stats): stats[i] = (stepping, step-end rate, request-step
        rate) per state for model i, all per tick."""
        init = self.initial()
        index = {init: 0}
        states = [init]
        rows, cols, vals, rewards = [], [], [], []
        stats = [([], [], []) for _ in range(self.K)]
        k = 0
        while k < len(states):
            s = states[k]
            succ, rew = self.successors(s)
            rewards.append(rew)
            co = sum(x[2] > 0 for x in s) > 1
            for i, (_, step, r, _) in enumerate(s):
                a = self._adv(i, sum(step), co) if r == 1 else 0.0
                stats[i][0].append(r > 0)
                stats[i][1].append(a)
                stats[i][2].append(a * sum(step))
            for nxt, p in succ:
                j = index.get(nxt)
                if j is None:
                    j = index[nxt] = len(states)
                    states.append(nxt)
                    if len(states) > self.max_states:
                        raise ChainTooLarge(f"more than {self.max_states} states")
                rows.append(k)
                cols.append(j)
                vals.append(p)
            k += 1
        n = len(states)
        P = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
        return states, P, np.asarray(rewards), [tuple(np.asarray(x, float) for x in st) for st in stats]


def stationary(P: sp.spmatrix) -> np.ndarray:
    """pi with pi P = pi and sum(pi) = 1. We pin one much-visited state's pi to 1, drop
    its balance equation, solve the remaining sparse system directly (SuperLU), and
    normalise: no dense normalisation row, so the factorisation stays sparse."""
    n = P.shape[0]
    if n == 1:
        return np.ones(1)
    A = (P.T - sp.identity(n, format="csr")).tocsr()
    k0 = int(np.argmax(np.asarray(P.sum(0)).ravel()))
    keep = np.r_[0:k0, k0 + 1:n]
    Ar = A[keep][:, keep].tocsc()
    rhs = -A[keep][:, [k0]].toarray().ravel()
    x = spla.spsolve(Ar, rhs, permc_spec="MMD_AT_PLUS_A")
    pi = np.insert(np.atleast_1d(x), k0, 1.0)
    if not np.all(np.isfinite(pi)):
        raise RuntimeError("the stationary solve failed (singular system: more than one closed class?)")
    pi = np.where(pi < 0, 0.0, pi)  # round-off only; the tests check it is tiny
    return pi / pi.sum()


def _build_within(system: System, resolution: int | None, max_states: int):
    """Build at `resolution`, or at the finest of 8..1 that fits, predicting the size of
    a fine chain from a coarse one (progress states grow about as resolution^models)."""
    fastest = min(system.step_ms(m, 1, False) for m in system.models)
    if resolution:
        return resolution, fastest / resolution, ChainBuilder(system, fastest / resolution, max_states).build()
    try:
        coarse = ChainBuilder(system, fastest, max_states).build()
    except ChainTooLarge:
        raise ChainTooLarge(f"the chain for N={system.concurrency} has more than {max_states} states even "
                            "at the coarsest resolution; raise max_states or use the simulator") from None
    k = len(system.models)
    for res in (8, 6, 4, 3, 2):
        if len(coarse[0]) * res ** k * 0.5 > max_states:
            continue
        try:
            return res, fastest / res, ChainBuilder(system, fastest / res, max_states).build()
        except ChainTooLarge:
            continue
    return 1, fastest, coarse


def solve(system: System, *, resolution: int | None = None, max_states: int = DEFAULT_MAX_STATES) -> ChainResult:
    """Stationary throughput of `system`. `resolution`: ticks per batch-1 step of the
    fastest model (finer is more exact, and larger); by default the finest of 8, 6, 4,
    3, 2, 1 whose chain fits in `max_states`."""
    res, tick, (states, P, rewards, stats) = _build_within(system, resolution, max_states)
    pi = stationary(P)
    throughput = float(pi @ rewards) / tick * 1000.0
    M = list(system.models)
    util, steps, mean_batch = {}, {}, {}
    for i, m in enumerate(M):
        running, ends, reqs = stats[i]
        util[m] = float(pi @ running)
        e = float(pi @ ends)
        steps[m] = e / tick * 1000.0
        mean_batch[m] = float(pi @ reqs) / e if e > 0 else 0.0
    lat = system.concurrency / throughput * 1000.0 if throughput > 0 else math.inf
    return ChainResult(throughput, lat, {m: system.batch_of(m) for m in M}, len(states), P.nnz, tick,
                       util, mean_batch, steps, pi, res)
