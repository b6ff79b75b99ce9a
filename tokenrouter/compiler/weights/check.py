"""Router and head weights files against their declarations, for `tokenrouter check`.

Only headers are read (safetensors metadata and tensor shapes), so a check stays fast.
A file that does not fit its declaration (architecture, input layout, shapes) is an error
E310 at the declaration; a file fitted for other models than the program declares (the
fingerprints `tokenrouter fit` records) is a warning W004. A path that exists but cannot be
a weights file (a folder, a device, a pipe, an unreadable file) is E311. A weights file that
does not exist yet is not reported by `weight_diagnostics`: `fit` writes it; serving asks
`required_weights`, which reports it as E311 too.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

from tokenrouter.compiler import ir
from tokenrouter.compiler.weights import files as rn
from tokenrouter.dsl.diagnostics import Diagnostic


def _shown(path: str) -> str:
    """A path as a message shows it: relative to the working folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _heads(transitions: Iterable[ir.Transition]) -> list[ir.HeadLogit]:
    """The first use of each distinct head row (model, file) in the rules."""
    out, seen = [], set()
    for t in transitions:
        for e in ir.walk(t.when):
            if isinstance(e, ir.HeadLogit) and (e.model, e.file) not in seen:
                seen.add((e.model, e.file))
                out.append(e)
    return out


def weight_diagnostics(routers: Iterable[ir.RouterNet], transitions: Iterable[ir.Transition],
                       models: list[ir.Model], folder_of: Callable[[ir.Model], str | None],
                       hidden_size_of: Callable[[ir.Model], int | None]) -> list[Diagnostic]:
    by_name = {m.name: m for m in models}
    large = [m for m in models if m.role == "large"]
    diags: list[Diagnostic] = []
    prints: dict[str, str | None] = {}

    def fingerprint(model: ir.Model) -> str | None:
        if model.name not in prints:
            folder = folder_of(model)
            prints[model.name] = rn.folder_fingerprint(folder) if folder else None
        return prints[model.name]

    def check_prints(what: str, reads: str, path: str, meta: dict, span) -> None:
        fps = rn.fingerprints(meta)
        pairs = [("reads", by_name.get(reads))]
        if len(large) == 1 and large[0].name != reads:
            pairs.append(("large", large[0]))
        for role, model in pairs:
            want = (fps.get(role) or {}).get("fingerprint")
            if not want or model is None:
                continue
            have = fingerprint(model)
            if have is not None and have != want:
                fitted = (fps.get(role) or {}).get("name", "?")
                diags.append(Diagnostic(
                    "W004", f"{what} was fitted with {'the model it reads' if role == 'reads' else 'the large model'} "
                    f"'{fitted}' (fingerprint {want}), but '{model.name}' ({model.path}) has fingerprint {have}", span,
                    hint=f"refit it for these models: tokenrouter fit FILE.route --router NAME --out {path}"))

    for r in routers:
        what = f"router '{r.name}'"
        if not os.path.exists(r.file):
            continue
        if rn.file_problem(r.file):
            diags.append(Diagnostic("E311", f"{what}: {_shown(r.file)}: {rn.file_problem(r.file)}", r.span))
            continue
        try:
            meta, shapes = rn.read_header(r.file)
        except rn.RouterWeightsError as exc:
            diags.append(Diagnostic("E310", f"{what}: {exc}", r.span))
            continue
        problems = rn.file_problems(r, meta, shapes)
        if problems:
            diags.append(Diagnostic("E310", f"{what}: {os.path.basename(r.file)}: {problems[0]}", r.span,
                                    hint=f"the file's tensors must follow arch = {r.arch} (compiler/weights/nets.py)"))
            continue
        check_prints(what, r.model, r.file, meta, r.span)
    for h in _heads(transitions):
        what = f"head row {os.path.basename(h.file)}"
        if not os.path.exists(h.file):
            continue
        if rn.file_problem(h.file):
            diags.append(Diagnostic("E311", f"{what}: {_shown(h.file)}: {rn.file_problem(h.file)}", h.span))
            continue
        try:
            meta, shapes = rn.read_header(h.file)
        except rn.RouterWeightsError as exc:
            diags.append(Diagnostic("E310", f"{what}: {exc}", h.span))
            continue
        model = by_name.get(h.model)
        problems = rn.head_problems(meta, shapes, hidden_size_of(model) if model else None)
        if problems:
            diags.append(Diagnostic("E310", f"{what}: {problems[0]}", h.span))
            continue
        check_prints(what, h.model, h.file, meta, h.span)
    return diags


def required_weights(program: ir.Program) -> list[Diagnostic]:
    """E311 for every router or head weights file a program needs that is not a readable
    file (serving needs them all; `weight_diagnostics` let a missing one pass for `fit`)."""
    diags = []
    for r in program.routers:
        why = rn.file_problem(r.file)
        if why is not None:
            diags.append(Diagnostic("E311", f"router '{r.name}': {_shown(r.file)}: {why}", r.span,
                                    hint=f"fit it: tokenrouter fit FILE.route --router {r.name} --out {r.file}"))
    for h in _heads(program.transitions):
        why = rn.file_problem(h.file)
        if why is not None:
            diags.append(Diagnostic("E311", f"head row {os.path.basename(h.file)}: {_shown(h.file)}: {why}", h.span))
    return diags
