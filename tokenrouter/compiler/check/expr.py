"""Type and range checking of conditions, producing IR expressions as it goes.

A condition is checked in the context of the writer whose step it reads (the source of a
transition): every feature must read that writer (or a member of it, when it is an
ensemble). Each value carries its type, its range (so a threshold outside the range of
its feature is caught) and, for a plain `feature OP constant`, the set of feature values
that make it true (used for unreachable-rule and ping-pong analysis). A value that
already produced an error is `BAD`: everything built on it is silently BAD too, so one
mistake gives one diagnostic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import FUNCTIONS, VISIT_TOKENS
from tokenrouter.compiler.features import FEATURES, LOGITS, StepFeature
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import did_you_mean, words

INF = math.inf


@dataclass(frozen=True)
class Interval:
    """The feature values for which a simple comparison holds."""

    lo: float
    lo_closed: bool
    hi: float
    hi_closed: bool

    def contains(self, other: "Interval") -> bool:
        lo_ok = self.lo < other.lo or (self.lo == other.lo and (self.lo_closed or not other.lo_closed))
        hi_ok = self.hi > other.hi or (self.hi == other.hi and (self.hi_closed or not other.hi_closed))
        return lo_ok and hi_ok

    def intersects(self, other: "Interval") -> bool:
        lo, lo_c = max((self.lo, self.lo_closed), (other.lo, other.lo_closed), key=lambda t: (t[0], not t[1]))
        hi, hi_c = min((self.hi, self.hi_closed), (other.hi, other.hi_closed), key=lambda t: (t[0], t[1]))
        return lo < hi or (lo == hi and lo_c and hi_c)

    def show(self) -> str:
        return f"{'[' if self.lo_closed else '('}{_num(self.lo)}, {_num(self.hi)}{']' if self.hi_closed else ')'}"


def _num(x: float) -> str:
    if x in (INF, -INF):
        return "inf" if x > 0 else "-inf"
    return f"{x:g}"


@dataclass(frozen=True)
class Feature:
    """A scalar value of one model, for comparisons across rules. `kind` identifies it
    (a step feature as a router's inputs write it, `entropy(normalized)`; `router:NAME`,
    `head:NAME`, `visit_tokens`); `words` names it in messages ("normalized entropy");
    `comparable`: it means the same of any model (a function of the distribution alone), so
    two writers' rules on it can ping-pong; `range_hint`: more to say about its range."""

    kind: str
    model: str | None
    describe: str  # "slm's normalized entropy"
    words: str = ""
    comparable: bool = False
    range_hint: str | None = None


def step_value(decl: StepFeature, node, model: str) -> "Val":
    """A scalar step feature's value as the checker types it: its range and identity, from
    its declaration."""
    lo, hi = decl.value.range(node)
    what = decl.value.words_of(node)
    feat = Feature(decl.text(node), model, f"{model}'s {what}", what, decl.reads == (LOGITS,),
                   decl.value.range_hint(node))
    return Val("num", node, lo, hi, feature=feat)


@dataclass(frozen=True)
class Val:
    type: str  # bool | num | vec | bad
    ir: object = None
    lo: float = -INF
    hi: float = INF
    feature: Feature | None = None
    simple: tuple[Feature, Interval] | None = None  # for `feature OP constant`
    const: float | None = None


BAD = Val("bad")
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_OP_WORDS = {"and": "'and'", "or": "'or'", "not": "'not'"}
_ORDINALS = {2: "second", 3: "third", 4: "fourth"}


def _truth_interval(op: str, c: float) -> Interval | None:
    """Values x with `x op c`."""
    if op == ">":
        return Interval(c, False, INF, False)
    if op == ">=":
        return Interval(c, True, INF, False)
    if op == "<":
        return Interval(-INF, False, c, False)
    if op == "<=":
        return Interval(-INF, False, c, True)
    return Interval(c, True, c, True) if op == "==" else None


class ExprChecker:
    """Checks one expression tree. `err(code, message, span, hint=None, notes=())` reports."""

    def __init__(self, symbols: dict, err: Callable, used: set, reported: set):
        self.symbols = symbols  # name -> checker Symbol (kind, decl, ...)
        self.err = err
        self.used = used
        self.reported = reported  # undefined names already reported (no cascades)

    # -- entry
    def condition(self, node: ast.Expr, running: tuple[str, ...], writer: str) -> Val:
        self.running, self.writer = running, writer
        val = self.expr(node)
        if val.type == "num":
            self.err("E304", "a condition must be true or false, but this is a number", node.span,
                     hint="compare it with a threshold, e.g. `... > 0.5`")
            return BAD
        if val.type == "vec":
            return BAD  # already reported
        return val

    # -- dispatch
    def expr(self, node) -> Val:
        if isinstance(node, ast.Num):
            return Val("num", ir.Const(float(node.value), node.span, param=node.param), node.value, node.value,
                       const=float(node.value))
        if isinstance(node, (ast.Str, ast.Duration, ast.ListLit)):
            what = {ast.Str: "a string", ast.Duration: "a duration", ast.ListLit: "a list"}[type(node)]
            self.err("E304", f"{what} cannot be part of a condition", node.span,
                     hint="conditions compare features with numbers, e.g. `entropy(slm, normalized) > 0.3`")
            return BAD
        if isinstance(node, ast.Ref):
            return self.ref(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Unary):
            return self.unary(node)
        if node.op in ("and", "or"):
            return self.logic(node)
        if node.op in ("<", "<=", ">", ">=", "==", "!="):
            return self.compare(node)
        return self.arith(node)

    # -- names
    def ref(self, node: ast.Ref) -> Val:
        name, span = node.name.text, node.span
        if name == VISIT_TOKENS:
            return Val("num", ir.VisitTokens(span), 1, INF, feature=Feature("visit_tokens", None, "visit_tokens"))
        sym = self.symbols.get(name)
        if sym is None:
            if name in FUNCTIONS:
                self.err("E302", f"{name} needs arguments: {FUNCTIONS[name]}", span)
                return BAD
            if name in self.reported:
                return BAD
            self.reported.add(name)
            cands = [n for n, s in self.symbols.items() if s.kind in ("router", "head", "param")] + [VISIT_TOKENS]
            guess = did_you_mean(name, cands)
            self.err("E102", f"undefined name '{name}'", span,
                     hint=f"did you mean '{guess}'?" if guess else
                     "a condition uses features (entropy(...), top_prob(...), ...), routers, heads and visit_tokens")
            return BAD
        self.used.add(name)
        if sym.kind == "param":
            return BAD  # a parameter left in place has an invalid value, already reported
        if sym.kind in ("model", "ensemble"):
            self.err("E103", f"'{name}' is {'a model' if sym.kind == 'model' else 'an ensemble'}, not a value", span,
                     hint=f"read one of its features, e.g. entropy({name}, normalized) > 0.3"
                     if sym.kind == "model" else "read a feature of one of its members")
            return BAD
        if sym.kind == "router":
            if not sym.ok:
                return BAD
            if not self._reads(sym.model, span, f"router '{name}'"):
                return BAD
            return Val("num", ir.RouterProb(name, span), 0.0, 1.0,
                       feature=Feature(f"router:{name}", sym.model, f"router {name}'s probability"))
        # head
        if not sym.ok:
            return BAD
        if not self._reads(sym.model, span, f"head '{name}'"):
            return BAD
        node = ir.HeadLogit(sym.model, sym.file, sym.sigmoid, span)
        value = FEATURES[node.kind].value
        lo, hi = value.range(node)
        return Val("num", node, lo, hi,
                   feature=Feature(f"head:{name}", sym.model, f"head {name}'s {value.words_of(node)}"))

    def _reads(self, model: str, span, what: str) -> bool:
        """The running-model rule: a condition only reads the writer that just ran."""
        if model in self.running:
            return True
        members = "" if self.running == (self.writer,) else f" (or its members {words(self.running[:], 'and')})"
        self.err("E403", f"{what} reads '{model}', which is not running when rules out of "
                 f"'{self.writer}' are tried", span,
                 hint=f"a rule out of '{self.writer}' can only read '{self.writer}'{members}")
        return False

    # -- functions
    def call(self, node: ast.Call) -> Val:
        name, span, args = node.func.text, node.span, node.args
        if name not in FUNCTIONS:
            sym = self.symbols.get(name)
            if sym is not None and sym.kind in ("router", "head"):
                self.err("E301", f"'{name}' is a {sym.kind}, not a function", node.func.span,
                         hint=f"use it by name: `{name} > 0.5`")
                return BAD
            guess = did_you_mean(name, FUNCTIONS)
            self.err("E301", f"unknown function '{name}'", node.func.span,
                     hint=f"did you mean '{guess}'?" if guess else f"expected one of {words(FUNCTIONS)}")
            return BAD
        for arg in args:
            if arg.label is not None:
                self.err("E303", f"{name} takes positional arguments only", arg.label.span,
                         hint=f"write {FUNCTIONS[name]}")
                return BAD
        if name == "bernoulli":
            if len(args) != 2:
                self.err("E302", f"bernoulli takes 2 arguments, got {len(args)}", span, hint=f"write {FUNCTIONS[name]}")
                return BAD
            return self.bernoulli(node)
        decl = FEATURES[name]
        want = 1 + len(decl.args)
        if len(args) != want:
            self.err("E302", f"{name} takes {want} argument{'s' if want > 1 else ''}, got {len(args)}", span,
                     hint=f"write {FUNCTIONS[name]}")
            return BAD
        model = self.model_arg(name, args[0].value)
        if model is None:
            return BAD
        if not decl.scalar:
            self.err("E304", f"{name}(...) is a vector, so it cannot be compared in a condition", span,
                     hint="vectors are inputs of a router network: declare `router NAME on MODEL = \"file\" "
                          "{ inputs = [...] }` and compare the router's output")
            return BAD
        if not self._reads(model, args[0].value.span, f"{name}({model}, ...)" if len(args) > 1 else f"{name}({model})"):
            return BAD
        values = {}
        for n, (arg, given) in enumerate(zip(decl.args, args[1:]), 2):
            value = arg.parse(given.value)
            if value is None:
                self.err("E303", f"the {_ORDINALS[n]} argument of {name} is {arg.what}", given.value.span,
                         hint=arg.hint)
                return BAD
            values[arg.field] = value
        return step_value(decl, decl.node(model=model, **values, span=span), model)

    def model_arg(self, func: str, node) -> str | None:
        if not isinstance(node, ast.Ref):
            self.err("E303", f"the first argument of {func} is a model name", node.span,
                     hint=f"write {FUNCTIONS[func]}")
            return None
        name = node.name.text
        sym = self.symbols.get(name)
        if sym is None:
            if name in self.reported:
                return None
            self.reported.add(name)
            guess = did_you_mean(name, [n for n, s in self.symbols.items() if s.kind == "model"])
            self.err("E102", f"undefined model '{name}'", node.span,
                     hint=f"did you mean '{guess}'?" if guess else "declare it: model NAME = \"path\"")
            return None
        self.used.add(name)
        if sym.kind != "model":
            extra = (f"; '{name}' is an ensemble of {words(sym.members, 'and')}: read one of them"
                     if sym.kind == "ensemble" else "")
            self.err("E103", f"{func} reads a model, but '{name}' is a {sym.kind}", node.span,
                     hint=f"write {FUNCTIONS[func]}{extra}")
            return None
        return name

    def bernoulli(self, node: ast.Call) -> Val:
        p, seed = node.args[0].value, node.args[1].value
        for arg in (p, seed):
            sym = self.symbols.get(arg.name.text) if isinstance(arg, ast.Ref) else None
            if sym is not None and sym.kind == "param":
                return BAD  # a parameter left in place: its value is invalid, already reported
        if not isinstance(p, ast.Num):
            self.err("E303", "the probability of bernoulli must be a number", p.span, hint="write bernoulli(0.05, 7)")
            return BAD
        if not 0.0 <= p.value <= 1.0:
            self.err("E305", f"bernoulli's probability must lie in [0, 1], got {p.text or p.value}", p.span)
            return BAD
        if not (isinstance(seed, ast.Num) and seed.is_int and seed.value >= 0):
            self.err("E303", "the seed of bernoulli must be a whole number >= 0", seed.span,
                     hint="write bernoulli(0.05, 7)")
            return BAD
        return Val("bool", ir.Bernoulli(float(p.value), int(seed.value), node.span))

    # -- operators
    def unary(self, node: ast.Unary) -> Val:
        val = self.expr(node.operand)
        if val.type == "bad":
            return BAD
        if node.op == "not":
            if val.type != "bool":
                self.err("E304", "'not' applies to a condition, but this is a number", node.operand.span)
                return BAD
            return Val("bool", ir.Logic("not", (val.ir,), node.span))
        if val.type != "num":
            self.err("E304", "'-' applies to a number, but this is a condition", node.operand.span)
            return BAD
        return Val("num", ir.Arith("-", ir.Const(0.0, node.span), val.ir, node.span), -val.hi, -val.lo)

    def logic(self, node: ast.Binary) -> Val:
        left, right = self.expr(node.left), self.expr(node.right)
        ok = True
        for side, val in ((node.left, left), (node.right, right)):
            if val.type == "num":
                self.err("E304", f"{_OP_WORDS[node.op]} joins conditions, but this is a number", side.span,
                         hint="compare it with a threshold, e.g. `... > 0.5`")
                ok = False
        if not ok or "bad" in (left.type, right.type):
            return BAD
        return Val("bool", ir.Logic(node.op, (left.ir, right.ir), node.span))

    def arith(self, node: ast.Binary) -> Val:
        left, right = self.expr(node.left), self.expr(node.right)
        if "bad" in (left.type, right.type):
            return BAD
        for side, val in ((node.left, left), (node.right, right)):
            if val.type != "num":
                self.err("E304", f"'{node.op}' applies to numbers, but this is a condition", side.span)
                return BAD
        return Val("num", ir.Arith(node.op, left.ir, right.ir, node.span))

    def compare(self, node: ast.Binary) -> Val:
        left, right = self.expr(node.left), self.expr(node.right)
        if "bad" in (left.type, right.type):
            return BAD
        for side, val in ((node.left, left), (node.right, right)):
            if val.type != "num":
                self.err("E304", f"'{node.op}' compares numbers, but this is a condition", side.span)
                return BAD
        out = Val("bool", ir.Compare(node.op, left.ir, right.ir, node.span))
        feat, const, const_node, op = None, None, None, node.op
        if left.feature is not None and right.const is not None:
            feat, const, const_node = left, right.const, node.right
        elif right.feature is not None and left.const is not None:
            feat, const, const_node, op = right, left.const, node.left, _FLIP[node.op]
        if feat is None:
            return out
        if not feat.lo <= const <= feat.hi:
            desc = feat.feature.describe
            hint = f"{desc} lies in [{_num(feat.lo)}, {_num(feat.hi)}]"
            if feat.feature.range_hint:
                hint += f"; {feat.feature.range_hint}"
            self.err("E305", f"threshold {_num(const)} is outside the range of {desc}", const_node.span, hint=hint)
            return BAD
        interval = _truth_interval(op, const)
        if interval is None:
            return out
        clipped = Interval(max(interval.lo, feat.lo), interval.lo_closed if interval.lo >= feat.lo else True,
                           min(interval.hi, feat.hi), interval.hi_closed if interval.hi <= feat.hi else True)
        return Val("bool", out.ir, simple=(feat.feature, clipped))

