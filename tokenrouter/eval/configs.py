"""The three configurations an evaluation compares: the small model alone, the large model
alone, and the routing program (`load`: the program with its parameters bound).

A model alone is served as a real program of its own: the routed program with every other
writer, transition, visit bound, router and ensemble removed, so the same runtime
(subserver, scheduler, engine, sampler) produces its tokens, with the model's declared
attributes (path, dtype, and whatever else a model block carries) unchanged.
"""

from __future__ import annotations

import dataclasses

from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import RouteError, load_program
from tokenrouter.runtime.loader import model_facts


class EvalError(ValueError):
    """An evaluation that cannot run as asked; the message says why."""


def load(path: str, params: dict[str, str] | None, model_paths: dict[str, str] | None = None):
    """The checked program with parameters bound; errors become EvalError."""
    try:
        return load_program(path, model_paths=model_paths, params=dict(params or {}) or None,
                            model_facts=model_facts)
    except RouteError as exc:
        raise EvalError(str(exc)) from None
    except ValueError as exc:  # unknown model_paths names, parameter binding errors
        raise EvalError(str(exc)) from None


def small_and_large(program: ir.Program, small: str | None = None, large: str | None = None) -> tuple[str, str]:
    """(small, large) model names: given ones, else the models declared `role = small` /
    `role = large`, else the start writer and the one other model."""
    names = [m.name for m in program.models]
    for given, what in ((small, "--small"), (large, "--large")):
        if given is not None and given not in names:
            raise EvalError(f"{what} {given!r} is not a model of the program (models: {', '.join(names)})")
    roles = {r: [m.name for m in program.models if m.role == r] for r in ("small", "large")}
    if large is None and len(roles["large"]) == 1:
        large = roles["large"][0]
    if small is None:
        if program.start in names and program.start != large:
            small = program.start
        elif len([n for n in roles["small"] if n != large]) == 1:
            small = next(n for n in roles["small"] if n != large)
    if large is None:
        others = [n for n in names if n != small]
        if len(others) == 1:
            large = others[0]
    if small is None or large is None:
        raise EvalError(f"cannot tell the small and the large model apart among {', '.join(names)}: "
                        "declare `role = small` / `role = large` or pass --small and --large")
    if small == large:
        raise EvalError(f"the small and the large model are both {small!r}")
    return small, large


def alone(program: ir.Program, model: str) -> ir.Program:
    """`program` reduced to `model` writing every token (see the module docstring)."""
    m = program.model(model)
    sched = program.schedule

    def only(pairs):
        return tuple(p for p in pairs if p[0] == model)

    schedule = dataclasses.replace(sched, batch=only(sched.batch), max_wait_ms=only(sched.max_wait_ms),
                                   placement=only(sched.placement), threads=only(sched.threads))
    return dataclasses.replace(program, source=f"{program.source} [{model} alone]", models=(m,), start=model,
                               transitions=(), bounds=(), ensembles=(), routers=(), schedule=schedule)
