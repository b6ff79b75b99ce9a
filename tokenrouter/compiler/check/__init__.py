"""Name resolution and semantic checks of a parsed .route file, as a sequence of passes.

Passes: version header; declarations (duplicates, kinds); parameters (bound to their
`--set` values or defaults, then substituted where they are used, check_params.py);
models (with their `--model` bindings), routers, heads and ensembles (attributes, paths, weights); the route block (start, transitions with their
conditions, visit bounds); whole-program analysis (reachability, shadowed rules, ping-pong,
unused declarations); the serve block. Every problem is reported (in source order, once
sorted), and the result is a `Checked` program in IR terms that `lower.py` assembles into
an `ir.Program`. A declaration that failed is marked not ok, so uses of it stay quiet.

This module runs the passes in order; each job is its own module, a mixin on the state
they share (`check_symbols.py`: the symbol table, `Checked`, the lookups):
`check_declarations.py` (header, names, parameters, models, ensembles, unused names),
`check_routers.py` (routers and heads), `check_route.py` (the route block and the analysis
of its rules, conditions typed by `check_expr.py`) and `check_serve.py` (the serve block).
`Checked`, `Symbol`, `resolve_path` and `bound_model_path` are importable from here.
"""

from __future__ import annotations

import os

from tokenrouter.compiler import ir
from tokenrouter.compiler.check import params as check_params
from tokenrouter.compiler.check.declarations import DeclarationChecks
from tokenrouter.compiler.check.route import RouteChecks
from tokenrouter.compiler.check.routers import RouterChecks
from tokenrouter.compiler.check.serve import ServeChecks
from tokenrouter.compiler.check.symbols import Checked, Symbol, bound_model_path, head_span, resolve_path
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note, sort_diagnostics

__all__ = ["Checked", "Symbol", "bound_model_path", "check", "resolve_path"]


def check(file: ast.File, base_dir: str | None = None, params: dict[str, str] | None = None,
          model_paths: dict[str, str] | None = None) -> tuple[Checked | None, list[Diagnostic]]:
    """All semantic checks; (Checked or None when there is an error, sorted diagnostics).
    `params` are `--set` values (NAME -> text), `model_paths` `--model` bindings (NAME ->
    path or built-in name; a relative path is relative to the working directory)."""
    checker = _Checker(file, base_dir if base_dir is not None else os.path.dirname(os.path.abspath(file.path)),
                       dict(params or {}), dict(model_paths or {}))
    checked = checker.run()
    diags = sort_diagnostics(checker.diags)
    return (None if any(d.is_error for d in diags) else checked), diags


class _Checker(DeclarationChecks, RouterChecks, RouteChecks, ServeChecks):
    """The passes, in order."""

    def run(self) -> Checked:
        self.header()
        self.declare()
        self.params()
        for item in self.file.items:
            handler = {ast.ModelDecl: self.model, ast.RouterDecl: self.router, ast.HeadDecl: self.head,
                       ast.EnsembleDecl: self.ensemble}.get(type(item))
            if handler:
                handler(item)
        routes = [i for i in self.file.items if isinstance(i, ast.RouteBlock)]
        serves = [i for i in self.file.items if isinstance(i, ast.ServeBlock)]
        for dup in routes[1:] + serves[1:]:
            first = routes[0] if isinstance(dup, ast.RouteBlock) else serves[0]
            what = "route" if isinstance(dup, ast.RouteBlock) else "serve"
            self.err("E101", f"a second '{what}' block", head_span(dup, what),
                     hint=f"a program has one '{what}' block; merge them",
                     notes=[Note("first declared here", head_span(first, what))])
        if routes:
            self.route(self.subst.route(routes[0]))
        else:
            end = self.file.header.span if self.file.header else ir.Span(self.file.path, 1, 1, 1, 2)
            self.err("E407", "the program has no 'route' block", end,
                     hint="add: route { start MODEL }")
        self.emit_models()
        self.analyse()
        if serves:
            self.serve(self.subst.serve(serves[0]))
        self.used |= self.subst.used
        self.unused()
        check_params.unknown_settings(self.given_params, self.bound, self.symbols, self.err)
        self.unknown_bindings()
        self.out.params = [check_params.to_ir(b) for b in self.bound.values() if b.ok]
        return self.out
