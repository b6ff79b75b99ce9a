"""IR expressions as `.route` text: the one printer.

`tokenrouter explain` shows conditions with it, the generated module's comments quote each
rule with it, and a router file's input layout names its inputs with it (`input_text`, the
`tokenrouter.inputs` metadata `weights/files.py` writes and compares). A step feature
prints as its declaration says (`features/`): `entropy(slm, normalized)` in a condition,
`entropy(normalized)` among a router's inputs. Parentheses appear only where precedence
needs them.
"""

from __future__ import annotations

from tokenrouter.compiler import ir
from tokenrouter.compiler.features import feature_of

_PREC = {"or": 1, "and": 2, "not": 3, "cmp": 4, "+": 5, "-": 5, "*": 6, "/": 6}
_ATOM = 9


def expr_text(e, named: bool = True) -> str:
    """An IR condition as .route-like text. With `named` a number that came from a parameter
    reads `tau=0.3`; without, `0.3`, as if it had been written (the generated module's
    comments, which must not change when a number becomes a parameter)."""
    return _expr(e, named)[0]


def input_text(inp: ir.RouterInput) -> str:
    """A router input as a router's `inputs` write it: `hidden(-1)`, `topk_logits(100)`,
    `entropy(normalized)` (the router's model is implied)."""
    node = inp.expr if isinstance(inp, ir.InputScalar) else inp
    decl = feature_of(node)
    return decl.text(node) if decl is not None else expr_text(node)


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else repr(x)  # the IR's types are not trusted here


def _expr(e, named: bool) -> tuple[str, int]:
    decl = feature_of(e)
    if decl is not None:
        return decl.text(e, e.model), _ATOM
    if isinstance(e, ir.Const):
        if e.param and named:
            return f"{e.param}={_num(e.value)}", _ATOM
        return _num(e.value), _ATOM
    if isinstance(e, ir.RouterProb):
        return e.router, _ATOM
    if isinstance(e, ir.Bernoulli):
        return f"bernoulli({_num(e.p)}, {e.seed})", _ATOM
    if isinstance(e, ir.VisitTokens):
        return "visit_tokens", _ATOM
    if isinstance(e, ir.Logic):
        if e.op == "not":
            text, prec = _expr(e.args[0], named)
            return "not " + (f"({text})" if prec < _ATOM else text), _PREC["not"]
        prec = _PREC.get(e.op, 0)  # an operator the IR does not know (a crafted one) binds least
        parts = []
        for a in e.args:
            text, p = _expr(a, named)
            parts.append(f"({text})" if p < prec else text)
        return f" {e.op} ".join(parts), prec
    if isinstance(e, (ir.Compare, ir.Arith)):
        prec = _PREC["cmp"] if isinstance(e, ir.Compare) else _PREC.get(e.op, 0)
        left, lp = _expr(e.left, named)
        right, rp = _expr(e.right, named)
        if lp < prec or (lp == prec and isinstance(e, ir.Compare)):
            left = f"({left})"
        if rp <= prec:
            right = f"({right})"
        return f"{left} {e.op} {right}", prec
    return type(e).__name__, _ATOM
