"""The reference interpreter of the routing IR: the oracle the generated code is tested against.

It follows one request at a time, in float64 NumPy on that request's own rows, written to
be read rather than to be fast. It shares no code with the generated module, only the IR
(including the IR's seeded hash `bernoulli_uniform`). It routes and combines; the handoff
between writers (`send`/`receive`) is `tokenrouter.protocol.handoff`, tested on its own.

Semantics (the generated code implements the same, see `codegen.py`):

* Route of writer W after it produced a token, with `visit_tokens` counting that token:
  1. if W's bound has `max_tokens` and `visit_tokens >= max_tokens`: go to the bound's
     `then`, keeping the token (this wins over every transition);
  2. else if `visit_tokens < min_tokens`: stay;
  3. else the transitions leaving W, in source order: the first whose condition holds
     moves the request to its destination, keeping or rewriting the token;
  4. else stay. Staying (also a transition whose destination is W itself) always keeps.
* Distributions: p = softmax(logits). A logits row is *invalid* when it holds a NaN or a
  +inf, or has no finite entry; every feature derived from an invalid row (entropy, top-1
  probability, margin, top-k logits, and an ensemble's combined distribution) is NaN.
  -inf logits are allowed (probability 0, contributing 0 to the entropy).
* Comparisons follow IEEE 754: a comparison with NaN is false, except `!=`, which is
  true. So a request whose features are NaN stays, unless its rule says `!=` or `not`.
* A number used as a condition is true when it is neither 0 nor NaN; a condition used as
  a number is 1.0 or 0.0. Arithmetic is IEEE (x / 0 is inf or NaN, never an error).
* A router network or head row whose input row has a non-finite entry outputs NaN.
* Top-k in an ensemble's `topk_union` includes ties: the tokens whose logit is at least the
  k-th largest logit of that member.
* Normalised entropy divides by log(V); V must be at least 2.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf

from tokenrouter.compiler import ir


class InterpreterError(ValueError):
    """The program or an input cannot be interpreted (a clear message, never a traceback)."""


@dataclass
class RequestStep:
    """One request's view of one step (the row the batched `StepTensors` hold for it)."""

    logits: Any = None  # [V]; None for an ensemble writer
    sampled: int = 0
    visit_tokens: int = 1
    position: int = 0
    request_seed: int = 0
    hidden: dict[int, Any] = field(default_factory=dict)  # layer -> [H]
    token_embedding: Any = None  # [H]
    member_logits: tuple[Any, ...] = ()


@dataclass
class Decision:
    dest: str
    keep: bool
    reason: str  # "max", "min", "transition <i>" or "stay"
    # Smallest |left - right| (relative to max(1, |left|, |right|)) over the comparisons the
    # decision read whose operands depend on floating-point features: how close the
    # decision came to a threshold tie (inf when there was none).
    min_gap: float = math.inf


# ------------------------------------------------------------------ distributions


@dataclass
class _Dist:
    logp: np.ndarray  # [V] float64, meaningless when not valid
    valid: bool
    logits: np.ndarray | None = None  # the raw logits (models only)


def _dist_from_logits(row: Any) -> _Dist:
    x = np.asarray(row, dtype=np.float64)
    if x.ndim != 1:
        raise InterpreterError(f"a logits row must be one-dimensional, got shape {x.shape}")
    valid = not (np.isnan(x).any() or np.isposinf(x).any()) and bool(np.isfinite(x).any())
    if not valid:
        return _Dist(np.full(x.shape, np.nan), False, x)
    m = x.max()
    z = math.fsum(math.exp(v - m) for v in x.tolist())
    logp = (x - m) - math.log(z)
    return _Dist(logp, True, x)


def _entropy(d: _Dist, normalized: bool) -> float:
    if not d.valid:
        return math.nan
    h = 0.0
    for lp in d.logp.tolist():
        p = math.exp(lp)
        if p > 0.0:
            h -= p * lp
    if normalized:
        v = d.logp.shape[0]
        if v < 2:
            raise InterpreterError("normalised entropy needs a vocabulary of at least 2 tokens")
        h /= math.log(v)
    return h


def _sorted_probs(d: _Dist) -> list[float]:
    return sorted((math.exp(lp) for lp in d.logp.tolist()), reverse=True)


def _top_prob(d: _Dist) -> float:
    return _sorted_probs(d)[0] if d.valid else math.nan


def _margin(d: _Dist) -> float:
    if not d.valid:
        return math.nan
    p = _sorted_probs(d)
    if len(p) < 2:
        raise InterpreterError("margin needs a vocabulary of at least 2 tokens")
    return p[0] - p[1]


def _topk_logits(d: _Dist, k: int) -> np.ndarray:
    if d.logits is None:
        raise InterpreterError("top-k logits are only defined on a model's own logits")
    if k > d.logits.shape[0]:
        raise InterpreterError(f"top-{k} logits of a vocabulary of {d.logits.shape[0]}")
    if not d.valid:
        return np.full(k, np.nan)
    return np.sort(d.logits)[::-1][:k].copy()


# ------------------------------------------------------------------ router weights


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh(x)
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":  # the exact (erf) form
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    raise InterpreterError(f"unknown activation {name!r}")


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    return (x - mu) / math.sqrt(var + 1e-5) * w + b


def _r2r_logit(t: dict[str, np.ndarray], r: ir.RouterNet, cols: list[np.ndarray]) -> float:
    """R2R's classifier, written out one request at a time (layout: weights/nets.py)."""
    parts = []
    for j, c in enumerate(cols):
        if f"inputs.{j}.weight" in t:
            c = t[f"inputs.{j}.weight"] @ c + t[f"inputs.{j}.bias"]
        parts.append(c)
    x = t["proj.weight"] @ np.concatenate(parts) + t["proj.bias"]
    i = 0
    while f"blocks.{i}.up.weight" in t:
        y = _layer_norm(x, t[f"blocks.{i}.norm.weight"], t[f"blocks.{i}.norm.bias"])
        y = _activation(r.activation, t[f"blocks.{i}.up.weight"] @ y + t[f"blocks.{i}.up.bias"])
        x = x + t[f"blocks.{i}.down.weight"] @ y + t[f"blocks.{i}.down.bias"]
        i += 1
    x = _layer_norm(x, t["norm.weight"], t["norm.bias"])
    return float((t["out.weight"] @ x + t["out.bias"])[0])


def _logsumexp(xs: np.ndarray) -> float:
    m = float(np.max(xs))
    if m == -math.inf:
        return -math.inf
    return m + math.log(math.fsum(math.exp(x - m) for x in xs.tolist()))


def _sigmoid(z: float) -> float:
    if math.isnan(z):
        return math.nan
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        return {k: np.asarray(v, dtype=np.float64) for k, v in load_file(path).items()}
    except FileNotFoundError:
        raise InterpreterError(f"{path}: no such weights file") from None
    except Exception as exc:  # a corrupt or non-safetensors file
        raise InterpreterError(f"{path}: not a readable safetensors file ({exc})") from None


def _resolve(path: str, base_dir: str | None) -> str:
    if os.path.isabs(path) or base_dir is None:
        return path
    return os.path.join(base_dir, path)


# ------------------------------------------------------------------ interpreter


class Interpreter:
    """Routes and combines for one request at a time."""

    def __init__(self, program: ir.Program, base_dir: str | None = None):
        self.program = program
        self.writers = program.writers()
        self.ensembles = {e.name: e for e in program.ensembles}
        self.routers = {r.name: r for r in program.routers}
        self.base_dir = base_dir
        self._mlps: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._heads: dict[tuple[str, str], tuple[np.ndarray, float]] = {}
        self._tensors: dict[str, dict[str, np.ndarray]] = {}

    # ---------------------------------------------------------------- route

    def route(self, writer: str, step: RequestStep) -> Decision:
        if writer not in self.writers:
            raise InterpreterError(f"unknown writer {writer!r}")
        bound = self.program.bound(writer)
        vt = int(step.visit_tokens)
        if bound.max_tokens is not None and vt >= bound.max_tokens:
            if bound.then is None:
                raise InterpreterError(f"the bound on {writer!r} has max_tokens but no 'then'")
            return Decision(bound.then, True, "max")
        if vt < bound.min_tokens:
            return Decision(writer, True, "min")
        ctx = _Context(self, writer, step)
        for i, t in enumerate(self.program.transitions_from(writer)):
            if ctx.truth(t.when):
                keep = t.action == "keep" or t.dest == writer
                return Decision(t.dest, keep, f"transition {i}", ctx.min_gap)
        return Decision(writer, True, "stay", ctx.min_gap)

    # ---------------------------------------------------------------- ensembles

    def combine(self, writer: str, step: RequestStep) -> np.ndarray:
        """The ensemble's next-token log-probabilities [V] for this request."""
        ens = self.ensembles.get(writer)
        if ens is None:
            raise InterpreterError(f"{writer!r} is not an ensemble")
        if len(step.member_logits) != len(ens.members):
            raise InterpreterError(
                f"ensemble {ens.name!r} has {len(ens.members)} members, "
                f"got {len(step.member_logits)} logits rows")
        dists = [_dist_from_logits(row) for row in step.member_logits]
        if len({d.logp.shape[0] for d in dists}) != 1:
            raise InterpreterError(f"ensemble {ens.name!r}: members' vocabularies differ")
        total = 0.0
        for w in ens.weights:
            total += w
        if ens.mode == "mixture":
            u = ir.bernoulli_uniform(ens.seed, step.request_seed, step.position)
            chosen, acc = len(ens.members) - 1, 0.0
            for i, w in enumerate(ens.weights):
                acc += w
                if u < acc / total:
                    chosen = i
                    break
            d = dists[chosen]
            return d.logp.copy() if d.valid else np.full(d.logp.shape, np.nan)
        v = dists[0].logp.shape[0]
        if not all(d.valid for d in dists):
            return np.full(v, np.nan)
        # log(sum_i w_i p_i) token by token, as m + log(sum_i exp(t_i - m)) with
        # t_i = log(w_i / total) + log p_i: log space, so that nothing underflows
        with np.errstate(divide="ignore"):
            terms = np.stack([math.log(w / total) + d.logp if w > 0 else np.full(v, -np.inf)
                              for d, w in zip(dists, ens.weights)])
        lp = np.array([_logsumexp(terms[:, j]) for j in range(v)])
        if ens.topk_union is not None:
            keep = np.zeros(v, dtype=bool)
            k = min(ens.topk_union, v)
            for d in dists:
                kth = np.sort(d.logits)[::-1][k - 1]
                keep |= d.logits >= kth
            lp = np.where(keep, lp, -np.inf)
            lp = lp - _logsumexp(lp)
        return lp

    # ---------------------------------------------------------------- weights

    def mlp(self, name: str) -> list[tuple[np.ndarray, np.ndarray]]:
        if name not in self._mlps:
            r = self.routers[name]
            path = _resolve(r.file, self.base_dir)
            t = _load_safetensors(path)
            layers = []
            while f"layers.{len(layers)}.weight" in t:
                i = len(layers)
                layers.append((t[f"layers.{i}.weight"], t[f"layers.{i}.bias"]))
            if not layers:
                raise InterpreterError(f"{path}: no tensor 'layers.0.weight'")
            self._mlps[name] = layers
        return self._mlps[name]

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        if name not in self._tensors:
            self._tensors[name] = _load_safetensors(_resolve(self.routers[name].file, self.base_dir))
        return self._tensors[name]

    def head(self, h: ir.HeadLogit) -> tuple[np.ndarray, float]:
        key = (h.model, h.file)
        if key not in self._heads:
            t = _load_safetensors(_resolve(h.file, self.base_dir))
            w = t["weight"].reshape(-1)
            b = float(t["bias"].reshape(-1)[0]) if "bias" in t else 0.0
            self._heads[key] = (w, b)
        return self._heads[key]


class _Context:
    """Evaluates expressions for one request at one step; remembers how close it came to a tie."""

    def __init__(self, interp: Interpreter, writer: str, step: RequestStep):
        self.i, self.writer, self.step = interp, writer, step
        self.min_gap = math.inf
        self._dists: dict[str, _Dist] = {}

    # -- distributions the writer's step holds
    def dist(self, model: str) -> _Dist:
        if model not in self._dists:
            ens = self.i.ensembles.get(self.writer)
            if model == self.writer and ens is None:
                if self.step.logits is None:
                    raise InterpreterError(f"step of {model!r} has no logits")
                self._dists[model] = _dist_from_logits(self.step.logits)
            elif ens is not None and model == ens.name:
                logp = self.i.combine(ens.name, self.step)
                self._dists[model] = _Dist(logp, not bool(np.isnan(logp).any()))
            elif ens is not None and model in ens.members:
                row = self.step.member_logits[ens.members.index(model)]
                self._dists[model] = _dist_from_logits(row)
            else:
                raise InterpreterError(f"the step of {self.writer!r} does not read {model!r}")
        return self._dists[model]

    def hidden(self, layer: int, dim: int) -> np.ndarray:
        if layer not in self.step.hidden:
            raise InterpreterError(f"hidden state of layer {layer} missing")
        h = np.asarray(self.step.hidden[layer], dtype=np.float64).reshape(-1)
        if h.shape[0] != dim:
            raise InterpreterError(f"hidden state of layer {layer} has width {h.shape[0]}, not {dim}")
        return h

    # -- values: (value, depends-on-floating-point-features)
    def truth(self, e: ir.Expr) -> bool:
        v, _ = self.value(e)
        if isinstance(v, bool):
            return v
        return not (v == 0.0 or math.isnan(v))

    def number(self, e: ir.Expr) -> tuple[float, bool]:
        v, inexact = self.value(e)
        return (1.0 if v else 0.0, inexact) if isinstance(v, bool) else (v, inexact)

    def value(self, e: ir.Expr) -> tuple[float | bool, bool]:
        s = self.step
        if isinstance(e, ir.Const):
            return float(e.value), False
        if isinstance(e, ir.VisitTokens):
            return float(s.visit_tokens), False
        if isinstance(e, ir.Bernoulli):
            return ir.bernoulli_uniform(e.seed, s.request_seed, s.position) < e.p, False
        if isinstance(e, ir.Entropy):
            return _entropy(self.dist(e.model), e.normalized), True
        if isinstance(e, ir.TopProb):
            return _top_prob(self.dist(e.model)), True
        if isinstance(e, ir.Margin):
            return _margin(self.dist(e.model)), True
        if isinstance(e, ir.RouterProb):
            return self.router_prob(e.router), True
        if isinstance(e, ir.HeadLogit):
            return self.head_logit(e), True
        if isinstance(e, ir.Compare):
            (a, ia), (b, ib) = self.number(e.left), self.number(e.right)
            if (ia or ib) and not (math.isnan(a) or math.isnan(b)):
                scale = max(1.0, abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else 1.0
                gap = abs(a - b) / scale if math.isfinite(a - b) else math.inf
                self.min_gap = min(self.min_gap, gap)
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
                    "==": a == b, "!=": a != b}[e.op], False
        if isinstance(e, ir.Logic):
            vals = [self.truth(a) for a in e.args]  # no short circuit: every gap is seen
            if e.op == "not":
                return not vals[0], False
            return (all(vals) if e.op == "and" else any(vals)), False
        if isinstance(e, ir.Arith):
            (a, ia), (b, ib) = self.number(e.left), self.number(e.right)
            with np.errstate(all="ignore"):
                x, y = np.float64(a), np.float64(b)
                r = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[e.op]
            r = float(r)
            exact = not (ia or ib) and r.is_integer() and abs(r) < 2 ** 24
            return r, not exact
        raise InterpreterError(f"unknown expression {type(e).__name__}")

    def router_prob(self, name: str) -> float:
        r = self.i.routers.get(name)
        if r is None:
            raise InterpreterError(f"unknown router {name!r}")
        if r.model != self.writer:
            raise InterpreterError(f"router {name!r} reads {r.model!r}, not {self.writer!r}")
        cols: list[np.ndarray] = []
        for inp in r.inputs:
            if isinstance(inp, ir.InputHidden):
                cols.append(self.hidden(inp.layer, inp.dim))
            elif isinstance(inp, ir.InputTokenEmbedding):
                if self.step.token_embedding is None:
                    raise InterpreterError("token embedding missing")
                te = np.asarray(self.step.token_embedding, dtype=np.float64).reshape(-1)
                if te.shape[0] != inp.dim:
                    raise InterpreterError(f"token embedding has width {te.shape[0]}, not {inp.dim}")
                cols.append(te)
            elif isinstance(inp, ir.InputTopkLogits):
                cols.append(_topk_logits(self.dist(r.model), inp.k))
            else:
                cols.append(np.array([self.number(inp.expr)[0]]))
        x = np.concatenate(cols)
        if not np.isfinite(x).all():
            return math.nan
        if r.arch == "r2r":
            return _sigmoid(_r2r_logit(self.i.tensors(name), r, cols))
        layers = self.i.mlp(name)
        for j, (w, b) in enumerate(layers):
            x = w @ x + b
            if j < len(layers) - 1:
                x = _activation(r.activation, x)
        if x.shape[0] == 1:
            return _sigmoid(float(x[0]))
        z = x - x.max()
        p = np.exp(z) / np.exp(z).sum()
        return float(p[r.output_index])

    def head_logit(self, e: ir.HeadLogit) -> float:
        if e.model != self.writer:
            raise InterpreterError(f"head of {e.model!r} read in the step of {self.writer!r}")
        if -1 not in self.step.hidden:
            raise InterpreterError("the final hidden state (layer -1) is missing")
        h = np.asarray(self.step.hidden[-1], dtype=np.float64).reshape(-1)
        if not np.isfinite(h).all():
            return math.nan
        w, b = self.i.head(e)
        z = float(w @ h) + b
        return _sigmoid(z) if e.sigmoid else z
