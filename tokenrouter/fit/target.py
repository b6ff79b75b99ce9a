"""The router or head a fit trains, as the program declares and uses it (`find_target`):
the model it reads, the model it hands off to, and the comparison with a threshold that
decides the labels' orientation; and the lines to put back in the `.route` file once the
threshold is chosen (`route_lines`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokenrouter.compiler import ir
from tokenrouter.compiler.check import resolve_path
from tokenrouter.compiler.text import input_text
from tokenrouter.dsl import ast
from tokenrouter.dsl.parser import parse_bytes
from tokenrouter.fit.errors import FitError


@dataclass
class Target:
    name: str
    arch: str  # mlp | citer | r2r | co_llm
    model: str  # the model whose step it reads
    large: str  # the model it hands off to
    op: str  # route when score `op` threshold
    constant: float  # the threshold the program compares it with
    router: ir.RouterNet | None  # None for a head


def _compares(e, match) -> tuple[str, float] | None:
    """(op as `score op const`, const) of the first comparison of `match` with a constant."""
    flip = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
    if isinstance(e, ir.Compare):
        if match(e.left) and isinstance(e.right, ir.Const):
            return e.op, e.right.value
        if match(e.right) and isinstance(e.left, ir.Const) and e.op in flip:
            return flip[e.op], e.left.value
    for child in [getattr(e, "left", None), getattr(e, "right", None), *getattr(e, "args", ())]:
        if child is not None:
            found = _compares(child, match)
            if found:
                return found
    return None


def find_target(program: ir.Program, route_path: str, name: str) -> Target:
    routers = {r.name: r for r in program.routers}
    heads = _head_decls(route_path)
    if name not in routers and name not in heads:
        declared = sorted(routers) + sorted(heads)
        raise FitError(f"{route_path}: no router or head named '{name}'"
                       + (f" (declared: {', '.join(declared)})" if declared else " (it declares none)"))
    if name in routers:
        r = routers[name]
        match = lambda e: isinstance(e, ir.RouterProb) and e.router == name  # noqa: E731
        model, arch = r.model, r.arch
    else:
        model, file = heads[name]
        match = lambda e: isinstance(e, ir.HeadLogit) and e.file == file  # noqa: E731
        r, arch = None, "co_llm"
    for t in program.transitions:
        found = _compares(t.when, match) if t.source == model else None
        if found:
            op, constant = found
            if op not in (">", ">=", "<", "<="):
                raise FitError(f"{route_path}: '{name}' is compared with {op}; fit needs <, <=, > or >=")
            return Target(name, arch, model, t.dest, op, float(constant), r)
    raise FitError(f"{route_path}: '{name}' is not compared with a threshold in a transition out of '{model}'")


def _head_decls(route_path: str) -> dict[str, tuple[str, str]]:
    with open(route_path, "rb") as f:
        tree, _, _ = parse_bytes(f.read(), route_path)
    base = os.path.dirname(os.path.abspath(route_path))
    return {i.name.text: (i.model.text, resolve_path(i.path.value, base))
            for i in (tree.items if tree else ()) if isinstance(i, ast.HeadDecl)}


def route_text(value: float) -> str:
    """A threshold as the report and the `.route` lines write it (4 decimals at most)."""
    return f"{value:.4f}".rstrip("0").rstrip(".") if value == value else "nan"


def route_lines(target: Target, out: str, route_path: str, threshold: float) -> list[str]:
    """The declaration of the fitted router or head (its weights `out`, relative to the
    program's folder) and the rule that compares it with `threshold`."""
    router = target.router
    rel = os.path.relpath(os.path.abspath(out), os.path.dirname(os.path.abspath(route_path)))
    t = route_text(threshold)
    if router is None:
        decl = f'head {target.name} on {target.model} = "{rel}" {{\n  sigmoid = true\n}}'
    else:
        attrs = [f"inputs = [{', '.join(input_text(i) for i in router.inputs)}]"]
        if router.arch != "mlp":
            attrs.append(f"arch = {router.arch}")
        if router.activation != "relu":
            attrs.append(f"activation = {router.activation}")
        decl = f'router {target.name} on {target.model} = "{rel}" {{\n' + "".join(f"  {a}\n" for a in attrs) + "}"
    return [decl, f"{target.model} -> {target.large} when {target.name} {target.op} {t} rewrite"]
