"""The compiler's pipeline, parse -> check -> lower: a .route file to a checked `ir.Program`.

    from tokenrouter.compiler.pipeline import check_file, load_program, RouteError
    from tokenrouter.runtime.loader import model_facts
    program, diagnostics = check_file(path, model_facts=model_facts)  # Program | None, diagnostics in source order
    program = load_program(path, model_facts=model_facts)  # raises RouteError (str() = rendered diagnostics)

`check_file` parses and checks without loading any model (router input widths of models
that are not checkpoint folders stay 0). `load_program` also resolves the models: input
widths, layer ranges, a shared tokenizer. What is known about a model comes from
`model_facts`, a function the caller passes (`model_facts.py`): the compiler loads no
model itself. `check_file` without one knows checkpoint folders only.

Both take the deployment's bindings, as the commands' `--model` and `--set` give them:
- `model_paths` ({"slm": "/tmp/x"}) binds models to paths (a checkpoint folder, a .gguf
  file or a built-in name; relative paths are relative to the working directory). It
  replaces a declared path, and is required for a model declared by role only
  (`model llm { role = large }`). A name that is not a declared model is an error (E707).
- `params` ({"tau": "0.3"}) sets parameters: NAME -> the value's text, parsed and checked
  against the declared type and range (E702, E703); a name that is not a declared
  parameter is an error (E704). `Program.params` records each bound value and whether it
  is the default or was set.
`commands/_args.py` parses the command-line form of both.
"""

from __future__ import annotations

import dataclasses
import os

from tokenrouter.compiler import ir
from tokenrouter.compiler.check import check
from tokenrouter.compiler.builtins import QUANTS
from tokenrouter.compiler.lower import lower
from tokenrouter.compiler.model_facts import ModelFactsFn, folders_only
from tokenrouter.dsl.diagnostics import Diagnostic, render_all, sort_diagnostics
from tokenrouter.dsl.parser import parse_bytes, parse_source

__all__ = ["check_file", "check_source", "load_program", "with_quant", "RouteError", "Diagnostic"]


class RouteError(Exception):
    """A program that does not check. `str()` is the rendered diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic], source: str | None = None):
        self.diagnostics = list(diagnostics)
        self.source = source
        super().__init__(render_all(self.diagnostics, source))


def check_source(text: str, path: str = "<input>", base_dir: str | None = None,
                 model_paths: dict[str, str] | None = None, full: bool = False,
                 params: dict[str, str] | None = None,
                 model_facts: ModelFactsFn | None = None) -> tuple[ir.Program | None, list[Diagnostic]]:
    """Parse, check and lower `text`; paths in it are relative to `base_dir` (default: the
    folder of `path`)."""
    tree, diags = parse_source(text, path)
    return _finish(tree, diags, path, base_dir, model_paths, full, params, True, model_facts)


def _finish(tree, diags, path, base_dir, model_paths, full, params, check_weights, model_facts):
    if full and model_facts is None:
        raise TypeError("resolving the models (full=True, load_program) needs model_facts "
                        "(tokenrouter.runtime.loader.model_facts)")
    if tree is None:
        return None, diags
    checked, diags = check(tree, base_dir, params=params, model_paths=model_paths)
    if checked is None:
        return None, diags
    # the checker has applied model_paths
    program, more = lower(checked, full, check_weights, model_facts or folders_only)
    return program, sort_diagnostics(diags + more)


def _read(path) -> tuple[bytes | None, list[Diagnostic]]:
    try:
        with open(path, "rb") as f:
            return f.read(), []
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return None, [Diagnostic("E004", f"cannot read {path}: {reason}", None)]


def check_file(path, model_paths: dict[str, str] | None = None, full: bool = False,
               params: dict[str, str] | None = None, check_weights: bool = True,
               model_facts: ModelFactsFn | None = None) -> tuple[ir.Program | None, list[Diagnostic]]:
    """Program (or None on any error) and every diagnostic, in source order."""
    path = os.fspath(path)
    data, diags = _read(path)
    if data is None:
        return None, diags
    tree, diags, _ = parse_bytes(data, path)
    return _finish(tree, diags, path, None, model_paths, full, params, check_weights, model_facts)


def load_program(path, model_paths: dict[str, str] | None = None,
                 params: dict[str, str] | None = None, check_weights: bool = True, *,
                 model_facts: ModelFactsFn) -> ir.Program:
    """The checked program, models resolved; raises RouteError on any error.
    `check_weights=False` does not read router/head weights files (`fit` replaces them)."""
    path = os.fspath(path)
    data, diags = _read(path)
    if data is None:
        raise RouteError(diags)
    tree, diags, text = parse_bytes(data, path)
    program, diags = _finish(tree, diags, path, None, model_paths, True, params, check_weights, model_facts)
    if program is None:
        raise RouteError([d for d in diags], text)
    return program


def with_quant(program, items: list[str] | None):
    """The program with `--quant Q` (every model) or `--quant NAME=Q` (one model) applied."""
    if not items:
        return program
    names = [m.name for m in program.models]
    every, per = None, {}
    for item in items:
        name, sep, q = item.rpartition("=")
        if q not in QUANTS:
            raise ValueError(f"--quant takes Q or NAME=Q with Q one of {', '.join(QUANTS)}, got {item!r}")
        if not sep:
            every = q
        elif name not in names:
            raise ValueError(f"--quant {item}: {name!r} is not a model of the program ({', '.join(names)})")
        else:
            per[name] = q
    models = tuple(dataclasses.replace(m, quant=per.get(m.name, every or m.quant)) for m in program.models)
    return dataclasses.replace(program, models=models)
