"""Parameters: their declarations, the values bound to them, and their substitution.

A spec declares `param tau: float = 0.3 in [0, 1]`; a deployment may override the value
with `--set tau=0.25`. Binding happens before any other check: each parameter gets one
typed value (the `--set` text parsed, or the default), validated against its type and
range, and every use of its name in a rule, a visit bound, the serve block or a weights
file is replaced by that value as a literal carrying the use's span. So the rest of the
checker, the IR and everything after it see plain numbers, durations and strings; the IR
records what was bound (`ir.Param`) and numbers remember the parameter they came from.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from tokenrouter.compiler import ir
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Note, did_you_mean, words
from tokenrouter.dsl.format import expr as format_expr

PARAM_TYPES = ("float", "int", "duration", "path", "string")
_RANGED = ("float", "int", "duration")
# Names that a value position reads as words, so a parameter may not take them.
RESERVED = ("normalized", "raw", "auto", "visit_tokens")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|us|s)$")
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
_INT = re.compile(r"^[+-]?\d+$")


@dataclass
class Bound:
    """A parameter after binding: its value (None when it has none or it is invalid)."""

    decl: ast.ParamDecl
    type: str
    value: Any = None
    origin: str = "default"
    text: str = ""
    lo: float | None = None
    hi: float | None = None
    ok: bool = True

    @property
    def name(self) -> str:
        return self.decl.name.text


def _show(ptype: str, x: float) -> str:
    if ptype == "duration":
        return f"{x:g}ms"
    return str(int(x)) if ptype == "int" else f"{x:g}"


def expectation(b: Bound) -> str:
    """'a float in [0, 1]', 'a whole number >= 1', 'a duration (like 20ms)', ..."""
    what = {"float": "a number", "int": "a whole number", "duration": "a duration (like 20ms)",
            "path": "a path", "string": "a string"}[b.type]
    if b.lo is not None and b.hi is not None:
        return f"{what} in [{_show(b.type, b.lo)}, {_show(b.type, b.hi)}]"
    return what


def parse_text(ptype: str, text: str) -> tuple[Any, str | None]:
    """A `--set` value: (value, None) or (None, why it is not one)."""
    t = text.strip()
    if ptype == "float":
        try:
            x = float(t)
        except ValueError:
            return None, f"'{text}' is not a number"
        if not math.isfinite(x):
            return None, f"'{text}' is not a finite number"
        return x, None
    if ptype == "int":
        if not _INT.match(t):
            return None, f"'{text}' is not a whole number"
        return int(t), None
    if ptype == "duration":
        m = _DURATION.match(t)
        if not m:
            return None, f"'{text}' is not a duration" + (" (it needs a unit: ms, us or s)"
                                                          if _INT.match(t) or _is_float(t) else "")
        return float(m.group(1)) * _UNIT_MS[m.group(2)], None
    if ptype == "path":
        if not t:
            return None, "the path is empty"
        return os.path.abspath(os.path.expanduser(t)), None  # relative to where the command runs
    return text, None


def _is_float(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def literal_value(ptype: str, node, base_dir: str) -> Any:
    """The value of a literal written in the .route file (a default or a range bound), or
    None when it is not a literal of this type."""
    if ptype == "float" and isinstance(node, ast.Num):
        return float(node.value)
    if ptype == "int" and isinstance(node, ast.Num) and node.is_int:
        return int(node.value)
    if ptype == "duration" and isinstance(node, ast.Duration):
        return float(node.ms)
    if ptype == "path" and isinstance(node, ast.Str) and node.value.strip():
        return os.path.normpath(os.path.join(base_dir, os.path.expanduser(node.value)))
    if ptype == "string" and isinstance(node, ast.Str):
        return node.value
    return None


def _literal_text(node) -> str:
    return format_expr(node)


def bind(decls: list[ast.ParamDecl], given: dict[str, str], base_dir: str,
         err: Callable) -> dict[str, Bound]:
    """Type, range, default and `--set` value of each declared parameter (first
    declarations only; duplicates are reported elsewhere)."""
    out: dict[str, Bound] = {}
    for decl in decls:
        name = decl.name.text
        ptype = decl.type.text
        if name in RESERVED:
            err("E701", f"'{name}' cannot name a parameter: the language reads it as a word", decl.name.span,
                hint=f"{words(RESERVED)} are read as words where values are expected; pick another name")
            out[name] = Bound(decl, ptype, ok=False)
            continue
        if ptype not in PARAM_TYPES:
            guess = did_you_mean(ptype, PARAM_TYPES)
            err("E701", f"unknown parameter type '{ptype}'", decl.type.span,
                hint=f"did you mean '{guess}'?" if guess else f"expected {words(PARAM_TYPES)}")
            out[name] = Bound(decl, ptype, ok=False)
            continue
        b = Bound(decl, ptype)
        out[name] = b
        if decl.range is not None and not _range(b, decl.range, base_dir, err):
            b.ok = False
            continue
        if decl.default is not None:
            value = literal_value(ptype, decl.default, base_dir)
            if value is None:
                err("E702", f"the default of parameter '{name}' is not {expectation(dataclasses.replace(b, lo=None))}",
                    decl.default.span, hint=f"'{name}' is declared as {ptype}")
                b.ok = False
                continue
            b.value, b.text = value, _literal_text(decl.default)
            if not _in_range(b, value):
                err("E703", f"the default {b.text} of parameter '{name}' is outside its range", decl.default.span,
                    hint=f"'{name}' is {expectation(b)}")
                b.ok = False
                continue
        if name in given:
            text = given[name]
            value, problem = parse_text(ptype, text)
            where = f"--set {name}={text}"
            if problem is not None:
                err("E702", f"{where}: {problem}; parameter '{name}' is {expectation(b)}", decl.name.span,
                    hint=f"e.g. --set {name}={_example(b)}")
                b.ok, b.value = False, None
                continue
            if not _in_range(b, value):
                err("E703", f"{where}: {_show(ptype, value) if ptype in _RANGED else text} is outside the range of "
                    f"parameter '{name}', which is {expectation(b)}", decl.name.span,
                    hint="the range is part of the declaration")
                b.ok, b.value = False, None
                continue
            b.value, b.origin, b.text = value, "set", text
        if b.value is None:
            err("E705", f"parameter '{name}' has no value", decl.name.span,
                hint=f"set it: --set {name}=VALUE ({expectation(b)}), or give it a default in the declaration")
            b.ok = False
    return out


def _example(b: Bound) -> str:
    if b.type == "duration":
        return "20ms"
    if b.lo is not None and b.hi is not None:
        mid = (b.lo + b.hi) / 2
        return _show(b.type, round(mid) if b.type == "int" else mid)
    return {"float": "0.5", "int": "1", "path": "weights/file.safetensors", "string": "text"}[b.type]


def _range(b: Bound, node, base_dir: str, err: Callable) -> bool:
    name = b.name
    if b.type not in _RANGED:
        err("E708", f"a {b.type} parameter has no range", node.span,
            hint=f"ranges bound numbers and durations; remove `in ...` from '{name}'")
        return False
    items = node.items if isinstance(node, ast.ListLit) else None
    if items is None or len(items) != 2:
        err("E708", f"the range of '{name}' is written [LOW, HIGH]", node.span,
            hint="e.g. in [0, 1]" if b.type != "duration" else "e.g. in [0ms, 1s]")
        return False
    lo, hi = (literal_value(b.type, i, base_dir) for i in items)
    bad = [i for i, v in zip(items, (lo, hi)) if v is None]
    if bad:
        err("E708", f"a bound of the range of '{name}' is not {expectation(b)}", bad[0].span,
            hint=f"'{name}' is declared as {b.type}")
        return False
    if lo > hi:
        err("E708", f"the range of '{name}' is empty: {_show(b.type, lo)} > {_show(b.type, hi)}", node.span)
        return False
    b.lo, b.hi = float(lo), float(hi)
    return True


def _in_range(b: Bound, value) -> bool:
    if b.type not in _RANGED or b.lo is None:
        return True
    return b.lo <= value <= b.hi


def unknown_settings(given: dict[str, str], bound: dict[str, Bound], symbols: dict, err: Callable) -> None:
    """`--set NAME=...` for a name the program does not declare as a parameter: an error,
    never ignored."""
    for name in given:
        if name in bound:
            continue
        sym = symbols.get(name)
        if sym is not None:
            hint = (f"'{name}' is a model: bind its path with --model {name}=PATH" if sym.kind == "model"
                    else f"'{name}' is a {sym.kind}, not a parameter")
        else:
            guess = did_you_mean(name, list(bound))
            hint = (f"did you mean '{guess}'?" if guess else
                    (f"the parameters are {words(sorted(bound), 'and')}" if bound
                     else f"the program declares no parameters; declare one: param {name}: float = ..."))
        err("E704", f"--set {name}={given[name]}: the program has no parameter '{name}'", None, hint=hint)


def to_ir(b: Bound) -> ir.Param:
    return ir.Param(b.name, b.type, b.value, b.origin, b.text, b.lo, b.hi, b.decl.span)


# ---------------------------------------------------------------- substitution


def literal(b: Bound, span) -> Any:
    """The bound value as a literal at a use's span."""
    if b.type in ("float", "int"):
        text = str(b.value) if b.type == "int" else f"{b.value:g}"
        return ast.Num(b.value, b.type == "int", text, span, param=b.name)
    if b.type == "duration":
        return ast.Duration(b.value, f"{b.value:g}ms", span)
    return ast.Str(b.value, '"' + str(b.value) + '"', span)


class Substitution:
    """Replaces parameter names in expressions by their bound values. `uses` maps each
    use's span to its parameter, so a diagnostic at a use can say where the value came
    from; `used` collects the parameter names that appear."""

    def __init__(self, bound: dict[str, Bound]):
        self.bound = bound
        self.uses: dict[Any, Bound] = {}
        self.used: set[str] = set()

    def expr(self, node):
        if isinstance(node, ast.Ref):
            b = self.bound.get(node.name.text)
            if b is None:
                return node
            self.used.add(b.name)
            if not b.ok:
                return node  # already reported; users of the name stay quiet
            self.uses[node.span] = b
            return literal(b, node.span)
        if isinstance(node, ast.Call):
            return dataclasses.replace(node, args=tuple(dataclasses.replace(a, value=self.expr(a.value))
                                                        for a in node.args))
        if isinstance(node, ast.ListLit):
            return dataclasses.replace(node, items=tuple(self.expr(i) for i in node.items))
        if isinstance(node, ast.Unary):
            return dataclasses.replace(node, operand=self.expr(node.operand))
        if isinstance(node, ast.Binary):
            return dataclasses.replace(node, left=self.expr(node.left), right=self.expr(node.right))
        return node

    def route(self, block: ast.RouteBlock) -> ast.RouteBlock:
        stmts = []
        for s in block.stmts:
            if isinstance(s, ast.Transition):
                s = dataclasses.replace(s, when=self.expr(s.when))
            elif isinstance(s, ast.Visit):
                s = dataclasses.replace(s, clauses=tuple(
                    c if isinstance(c.value, ast.Name) else dataclasses.replace(c, value=self.expr(c.value))
                    for c in s.clauses))
            stmts.append(s)
        return dataclasses.replace(block, stmts=tuple(stmts))

    def serve(self, block: ast.ServeBlock) -> ast.ServeBlock:
        return dataclasses.replace(block, entries=tuple(dataclasses.replace(e, value=self.expr(e.value))
                                                        for e in block.entries))

    def note(self, span) -> Note | None:
        b = self.uses.get(span)
        if b is None:
            return None
        how = f"--set {b.name}={b.text}" if b.origin == "set" else f"its default, {b.text}"
        return Note(f"'{b.name}' is a {b.type} parameter, here bound to {how}", b.decl.span)
