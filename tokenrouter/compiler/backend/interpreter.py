"""The reference interpreter of the routing IR: the oracle the generated code is tested against.

It follows one request at a time, in float64 NumPy on that request's own rows, written to
be read rather than to be fast. It shares no code with the generated module, only the IR
(including the IR's seeded hash `bernoulli_uniform`) and the step features' declarations:
each feature's reference computation there (`features/catalog.py`, pure Python) is its
oracle, the helper the generated code calls (`protocol/features.py`, torch) is what it is
held to. Router networks and head rows are `interpreter_nets.py`. It routes and combines;
the handoff between writers (`send`/`receive`) is `tokenrouter.protocol.handoff`, tested
on its own.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.interpreter_nets import ACTIVATIONS, ReferenceNets
from tokenrouter.compiler.features import LOGITS, FeatureError, StepFeature, feature_of


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


def _logsumexp(xs: np.ndarray) -> float:
    m = float(np.max(xs))
    if m == -math.inf:
        return -math.inf
    return m + math.log(math.fsum(math.exp(x - m) for x in xs.tolist()))


# ------------------------------------------------------------------ interpreter


class Interpreter:
    """Routes and combines for one request at a time."""

    def __init__(self, program: ir.Program, base_dir: str | None = None):
        self.program = program
        self.writers = program.writers()
        self.ensembles = {e.name: e for e in program.ensembles}
        self.routers = {r.name: r for r in program.routers}
        self.base_dir = base_dir
        self.nets = ReferenceNets(base_dir)

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

    def value(self, writer: str, step: RequestStep, e) -> Any:
        """What one expression, or one router input, is for one request of `writer`'s step
        (a float or a bool; a vector as a float64 array): features read one at a time."""
        ctx = _Context(self, writer, step)
        decl = feature_of(e)
        if decl is not None and not decl.scalar:
            return np.asarray(ctx.feature(decl, e, writer), dtype=np.float64).reshape(-1)
        return ctx.value(e)[0]

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

    def feature(self, decl: StepFeature, node, model: str):
        """A step feature of `model`, as its declaration's reference computes it."""
        if decl.reads != (LOGITS,) and (model != self.writer or self.writer in self.i.ensembles):
            raise InterpreterError(f"{decl.name} of {model!r} read in the step of {self.writer!r}")
        try:
            return decl.reference(node, _View(self, model))
        except FeatureError as exc:
            raise InterpreterError(str(exc)) from None

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
        decl = feature_of(e)
        if decl is not None:
            return self.feature(decl, e, e.model), True
        if isinstance(e, ir.RouterProb):
            return self.router_prob(e.router), True
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
        cols = [np.array([self.number(inp.expr)[0]]) if isinstance(inp, ir.InputScalar) else
                np.asarray(self.feature(feature_of(inp), inp, r.model), dtype=np.float64).reshape(-1)
                for inp in r.inputs]
        if r.activation not in ACTIVATIONS:
            raise InterpreterError(f"unknown activation {r.activation!r}")
        return self.i.nets.output(r, cols)


class _View:
    """What a step feature's reference reads of one model of the request's step
    (`features.declare.ReferenceView`)."""

    def __init__(self, ctx: _Context, model: str):
        self.ctx, self.model = ctx, model

    def dist(self) -> _Dist:
        return self.ctx.dist(self.model)

    def hidden(self, layer: int, dim: int | None = None) -> np.ndarray:
        if layer not in self.ctx.step.hidden:
            raise InterpreterError(f"hidden state of layer {layer} missing")
        h = np.asarray(self.ctx.step.hidden[layer], dtype=np.float64).reshape(-1)
        if dim is not None and h.shape[0] != dim:
            raise InterpreterError(f"hidden state of layer {layer} has width {h.shape[0]}, not {dim}")
        return h

    def embedding(self, dim: int) -> np.ndarray:
        if self.ctx.step.token_embedding is None:
            raise InterpreterError("token embedding missing")
        te = np.asarray(self.ctx.step.token_embedding, dtype=np.float64).reshape(-1)
        if te.shape[0] != dim:
            raise InterpreterError(f"token embedding has width {te.shape[0]}, not {dim}")
        return te

    def head_row(self, file: str) -> tuple[np.ndarray, float]:
        return self.ctx.i.nets.head_row(file)
