"""Name resolution and semantic checks of a parsed .route file, as a sequence of passes.

Passes: version header; declarations (duplicates, kinds); parameters (bound to their
`--set` values or defaults, then substituted where they are used, `params.py`); models
(with their `--model` bindings), routers, heads and ensembles (attributes, paths,
weights); the route block (start, transitions with their conditions, visit bounds);
whole-program analysis (reachability, shadowed rules, ping-pong, unused declarations);
the serve block. Every problem is reported (in source order, once sorted), and the result
is a `Checked` program in IR terms that `lower.py` assembles into an `ir.Program`. A
declaration that failed is marked not ok, so uses of it stay quiet.

`check` makes the one `CheckState` the passes share (`symbols.py`: the symbol table,
`Checked`, the lookups) and hands it to each pass in order. Each job is a module of
functions on that state: `declarations.py` (header, names, parameters, models,
ensembles, default roles, unused names), `routers.py` (routers and heads), `route.py`
(the route block and the analysis of its rules, conditions typed by `expr.py`) and
`serve.py` (the serve block). `Checked` and `resolve_path` are importable from here.
"""

from __future__ import annotations

import os

from tokenrouter.compiler import ir
from tokenrouter.compiler.check import declarations, route, routers, serve
from tokenrouter.compiler.check import params as check_params
from tokenrouter.compiler.check.symbols import Checked, CheckState, head_span, resolve_path
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note, sort_diagnostics

__all__ = ["Checked", "check", "resolve_path"]

# the pass of each kind of declaration; the declarations are checked in source order
_DECLARATIONS = {ast.ModelDecl: declarations.model, ast.RouterDecl: routers.router, ast.HeadDecl: routers.head,
                 ast.EnsembleDecl: declarations.ensemble}


def check(file: ast.File, base_dir: str | None = None, params: dict[str, str] | None = None,
          model_paths: dict[str, str] | None = None) -> tuple[Checked | None, list[Diagnostic]]:
    """All semantic checks; (Checked or None when there is an error, sorted diagnostics).
    `params` are `--set` values (NAME -> text), `model_paths` `--model` bindings (NAME ->
    path or built-in name; a relative path is relative to the working directory)."""
    state = CheckState(file, base_dir if base_dir is not None else os.path.dirname(os.path.abspath(file.path)),
                       dict(params or {}), dict(model_paths or {}))
    checked = _run(state)
    diags = sort_diagnostics(state.diags)
    return (None if any(d.is_error for d in diags) else checked), diags


def _run(state: CheckState) -> Checked:
    """The passes, in order."""
    file = state.file
    declarations.header(state)
    declarations.declare(state)
    declarations.bind_params(state)
    for item in file.items:
        handler = _DECLARATIONS.get(type(item))
        if handler:
            handler(state, item)
    declarations.engines(state)
    routes = [i for i in file.items if isinstance(i, ast.RouteBlock)]
    serves = [i for i in file.items if isinstance(i, ast.ServeBlock)]
    _one_block_each(state, routes, serves)
    rules = route.Rules()
    if routes:
        rules = route.route_block(state, state.subst.route(routes[0]))
    else:
        end = file.header.span if file.header else ir.Span(file.path, 1, 1, 1, 2)
        state.err("E407", "the program has no 'route' block", end, hint="add: route { start MODEL }")
    declarations.emit_models(state)
    route.analyse(state, rules)
    if serves:
        serve.serve_block(state, state.subst.serve(serves[0]))
    state.used |= state.subst.used
    declarations.unused(state)
    check_params.unknown_settings(state.given_params, state.bound, state.symbols, state.err)
    declarations.unknown_bindings(state)
    state.out.params = [check_params.to_ir(b) for b in state.bound.values() if b.ok]
    return state.out


def _one_block_each(state: CheckState, routes: list[ast.RouteBlock], serves: list[ast.ServeBlock]) -> None:
    for dup in routes[1:] + serves[1:]:
        first = routes[0] if isinstance(dup, ast.RouteBlock) else serves[0]
        what = "route" if isinstance(dup, ast.RouteBlock) else "serve"
        state.err("E101", f"a second '{what}' block", head_span(dup, what),
                  hint=f"a program has one '{what}' block; merge them",
                  notes=[Note("first declared here", head_span(first, what))])
