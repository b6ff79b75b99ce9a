"""Run lengths: how many steps a request stays on a model per visit.

The paper's chain assumes a constant switching probability p, i.e. geometric run lengths
P(K = k) = (1-p)^(k-1) p. Real routing is bursty (many one-token detours, then long calm
stretches), which a geometric fits badly. We model a run length as a discrete phase-type
distribution DPH(alpha, T): a visit starts in phase j with probability alpha_j, and after
each step moves to phase j' with probability T[j, j'] or leaves with the rest,
t_j = 1 - sum_j' T[j, j']. So P(K = k) = alpha T^(k-1) t. The chain carries the phase of
every request in its state; the geometric is the one-phase case.

We fit a mixture of geometrics (T diagonal) by EM and choose 1-3 phases by BIC: it is a
DPH, it captures burstiness (a short and a long mode), and its EM is short and stable.

A run length counts *steps* of the writer during one visit, the triggering step
included, even when that token is rewritten by the next writer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenrouter.tuner.errors import TuneError

TRACES_FORMAT = "tokenrouter-runlengths"


class RunLengthError(TuneError):
    """Unusable run-length data or parameters."""


@dataclass(frozen=True)
class PhaseType:
    """A discrete phase-type distribution on {1, 2, ...}."""

    alpha: tuple[float, ...]
    T: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        a, T = np.asarray(self.alpha, float), np.asarray(self.T, float)
        if a.ndim != 1 or T.shape != (a.size, a.size):
            raise RunLengthError("alpha must have one entry per phase and T be square")
        if (a < -1e-12).any() or abs(a.sum() - 1) > 1e-9:
            raise RunLengthError(f"alpha must be a probability vector, got {a.tolist()}")
        if (T < -1e-12).any() or (T.sum(1) > 1 + 1e-9).any():
            raise RunLengthError("T must be non-negative with row sums <= 1")

    # ----------------------------------------------------------- constructors
    @staticmethod
    def geometric(p: float) -> "PhaseType":
        """Switch with probability p after every step (p = 0: never leave)."""
        if not 0 <= p <= 1:
            raise RunLengthError(f"a switching probability must be in [0, 1], got {p}")
        return PhaseType((1.0,), ((1.0 - p,),))

    @staticmethod
    def mixture(weights, ps) -> "PhaseType":
        """A mixture of geometrics: with probability w_k the whole visit switches w.p. p_k."""
        w = np.asarray(weights, float)
        w = w / w.sum()
        return PhaseType(tuple(w.tolist()), tuple(tuple((1 - p) if i == j else 0.0 for j in range(len(ps)))
                                                  for i, p in enumerate(ps)))

    # ------------------------------------------------------------- queries
    @property
    def phases(self) -> int:
        return len(self.alpha)

    @property
    def exit(self) -> np.ndarray:
        return np.clip(1.0 - np.asarray(self.T).sum(1), 0.0, 1.0)

    def mean(self) -> float:
        """Expected steps per visit (inf when some phase is never left)."""
        a, T = np.asarray(self.alpha), np.asarray(self.T)
        try:
            m = float(a @ np.linalg.solve(np.eye(self.phases) - T, np.ones(self.phases)))
        except np.linalg.LinAlgError:
            return float("inf")
        return m if np.isfinite(m) and m > 0 else float("inf")

    def pmf(self, k) -> np.ndarray:
        ks = np.atleast_1d(np.asarray(k, int))
        a, T, t = np.asarray(self.alpha), np.asarray(self.T), self.exit
        out = np.zeros(ks.shape, float)
        v, cur = a.copy(), 1
        for idx in np.argsort(ks):
            while cur < ks[idx]:
                v, cur = v @ T, cur + 1
            out[idx] = v @ t if ks[idx] >= 1 else 0.0
        return out

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        a, T, t = np.asarray(self.alpha), np.asarray(self.T), self.exit
        if not np.isfinite(self.mean()):
            raise RunLengthError("cannot sample run lengths that never end")
        if np.allclose(T, np.diag(np.diag(T))):  # a mixture of geometrics: draw directly
            comp = rng.choice(self.phases, p=a, size=size)
            return rng.geometric(1.0 - np.diag(T)[comp])
        P = np.hstack([T, t[:, None]])  # row j: next phase or leave (last column)
        out = np.empty(size, int)
        for i in range(size):
            j, k = rng.choice(self.phases, p=a), 1
            while True:
                nxt = rng.choice(self.phases + 1, p=P[j] / P[j].sum())
                if nxt == self.phases:
                    break
                j, k = nxt, k + 1
            out[i] = k
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": list(self.alpha), "T": [list(r) for r in self.T], "mean": self.mean()}


# ------------------------------------------------------------------ fitting

def _check_samples(samples) -> np.ndarray:
    x = np.asarray(samples)
    if x.size == 0:
        raise RunLengthError("no run lengths to fit")
    if x.ndim != 1 or not np.all(np.equal(np.mod(x, 1), 0)) or (x < 1).any():
        raise RunLengthError("run lengths must be a flat list of integers >= 1")
    return x.astype(int)


def fit_geometric(samples) -> PhaseType:
    """Maximum likelihood: p = 1 / mean run length."""
    return PhaseType.geometric(1.0 / _check_samples(samples).mean())


def fit_mixture(samples, phases: int, *, iters: int = 500, tol: float = 1e-9) -> tuple[PhaseType, float]:
    """EM for a mixture of `phases` geometrics; returns (distribution, log-likelihood)."""
    x = _check_samples(samples)
    vals, counts = np.unique(x, return_counts=True)
    v, c = vals.astype(float), counts.astype(float)
    n = c.sum()
    # start from spread-out quantiles of 1/x so components do not collapse together
    qs = np.quantile(x, np.linspace(0.1, 0.9, phases)) if phases > 1 else np.array([x.mean()])
    p = np.clip(1.0 / np.maximum(qs, 1.0), 1e-6, 1.0)[::-1].copy()
    w = np.full(phases, 1.0 / phases)
    ll_old = -np.inf
    for _ in range(iters):
        logp = np.log(w)[None, :] + (v[:, None] - 1) * np.log1p(-np.minimum(p, 1 - 1e-12))[None, :] + np.log(p)[None, :]
        m = logp.max(1, keepdims=True)
        lik = m[:, 0] + np.log(np.exp(logp - m).sum(1))
        ll = float((c * lik).sum())
        r = np.exp(logp - lik[:, None]) * c[:, None]
        w = np.maximum(r.sum(0) / n, 1e-12)
        p = np.clip(r.sum(0) / np.maximum((r * v[:, None]).sum(0), 1e-300), 1e-9, 1.0)
        if ll - ll_old < tol * abs(ll):
            break
        ll_old = ll
    order = np.argsort(-p)  # short-run (high p) phase first, for stable reporting
    return PhaseType.mixture(w[order], p[order]), ll


def fit(samples, max_phases: int = 3) -> PhaseType:
    """The mixture of 1..max_phases geometrics with the best BIC (2k - 1 parameters)."""
    x = _check_samples(samples)
    best, best_bic = None, np.inf
    for k in range(1, max_phases + 1):
        dist, ll = fit_mixture(x, k)
        bic = (2 * k - 1) * np.log(x.size) - 2 * ll
        if bic < best_bic - 1e-9:
            best, best_bic = dist, bic
    return best


# ------------------------------------------------------------------- traces

def load_traces(path: str | os.PathLike) -> dict[str, list[int]]:
    """Read observed run lengths per model: {"format": "tokenrouter-runlengths",
    "version": 1, "runlengths": {model: [k, ...]}} or just {model: [k, ...]}."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RunLengthError(f"cannot read run lengths {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise RunLengthError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and data.get("format") == TRACES_FORMAT:
        data = data.get("runlengths")
    if not isinstance(data, dict) or not data:
        raise RunLengthError(f"{path}: expected an object mapping each model to a list of run lengths")
    out = {}
    for name, xs in data.items():
        if not isinstance(xs, list):
            raise RunLengthError(f"{path}: run lengths of {name!r} must be a list")
        try:
            out[name] = _check_samples(xs).tolist()
        except RunLengthError as exc:
            raise RunLengthError(f"{path}: model {name!r}: {exc}") from None
    return out


def save_traces(path: str | os.PathLike, runlengths: dict[str, list[int]]) -> None:
    Path(path).write_text(json.dumps({"format": TRACES_FORMAT, "version": 1,
                                      "runlengths": {k: list(map(int, v)) for k, v in runlengths.items()}}) + "\n")
