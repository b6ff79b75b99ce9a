"""What code generation relies on of the IR, checked before anything is generated: names
are unique and declared, actions, counts and weights are valid, router inputs are known
and well formed. The front end's checker reports all of these to users first; here they
guard a hand-made or corrupted IR (`CodegenError`).
"""

from __future__ import annotations

import math

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.literals import CodegenError, py_float, py_int, py_str, span_text
from tokenrouter.compiler.features import STEP_NAMES, Int, StepFeature, Word, feature_of

_ACTIVATIONS = {"relu", "gelu", "silu", "tanh"}


def check_program(p: ir.Program) -> None:
    """What code generation relies on; the front end's checker reports these first."""
    names = [m.name for m in p.models] + [e.name for e in p.ensembles]
    for n in names:
        py_str(n)
    if len(set(names)) != len(names):
        raise CodegenError(f"writer names are not unique: {names}")
    writers, models = set(names), {m.name for m in p.models}
    if p.start not in writers:
        raise CodegenError(f"start writer {p.start!r} is not declared")
    _check_rules(p, writers)
    for e in p.ensembles:
        _check_ensemble(e, models)
    seen = set()
    for r in p.routers:
        _check_router(r, models, seen)


def _check_rules(p: ir.Program, writers: set[str]) -> None:
    """Transitions and visit bounds name declared writers; actions and counts are valid."""
    for t in p.transitions:
        where = span_text(t.span)
        if t.source not in writers or t.dest not in writers:
            raise CodegenError(f"{where}: transition {t.source!r} -> {t.dest!r} names an undeclared writer")
        if t.action not in ("keep", "rewrite"):
            raise CodegenError(f"{where}: action must be keep or rewrite, not {t.action!r}")
    for b in p.bounds:
        where = span_text(b.span)
        if b.writer not in writers:
            raise CodegenError(f"{where}: visit bound on undeclared writer {b.writer!r}")
        py_int(b.min_tokens)
        if b.max_tokens is not None:
            py_int(b.max_tokens)
            if b.then is None:
                raise CodegenError(f"{where}: the bound on {b.writer!r} sets max but no 'then'")
        if b.then is not None and b.then not in writers:
            raise CodegenError(f"{where}: 'then' names undeclared writer {b.then!r}")


def _check_ensemble(e: ir.Ensemble, models: set[str]) -> None:
    where = span_text(e.span)
    if not e.members or any(m not in models for m in e.members):
        raise CodegenError(f"{where}: ensemble {e.name!r} members must be declared models")
    if len(e.weights) != len(e.members):
        raise CodegenError(f"{where}: ensemble {e.name!r} needs one weight per member")
    for w in e.weights:
        py_float(w)
    if any(not (math.isfinite(w) and w >= 0) for w in e.weights) or sum(e.weights) <= 0:
        raise CodegenError(f"{where}: ensemble {e.name!r} weights must be finite, >= 0, not all 0")
    if e.mode not in ("average", "mixture"):
        raise CodegenError(f"{where}: ensemble mode must be average or mixture")
    if e.topk_union is not None and int(py_int(e.topk_union)) < 1:
        raise CodegenError(f"{where}: topk_union must be at least 1")
    py_int(e.seed)


def _check_router(r: ir.RouterNet, models: set[str], seen: set[str]) -> None:
    """One router network (`seen`: the names of those before it)."""
    where = span_text(r.span)
    py_str(r.name)
    if r.name in seen:
        raise CodegenError(f"{where}: router {r.name!r} declared twice")
    seen.add(r.name)
    if r.model not in models:
        raise CodegenError(f"{where}: router {r.name!r} reads undeclared model {r.model!r}")
    if r.activation not in _ACTIVATIONS:
        raise CodegenError(f"{where}: unknown activation {r.activation!r}")
    py_int(r.output_index)
    if not r.inputs:
        raise CodegenError(f"{where}: router {r.name!r} has no inputs")
    for inp in r.inputs:
        if isinstance(inp, ir.InputScalar):
            continue  # an expression: checked where it is lowered
        decl = feature_of(inp)
        if decl is None or decl.scalar:
            raise CodegenError(f"{where}: unknown router input {inp!r}")
        feature_fields(decl, inp, where)
        if int(py_int(getattr(inp, decl.value.width))) < 0:  # 0: not known before the model is resolved
            raise CodegenError(f"{where}: input width must not be negative")


def feature_fields(decl: StepFeature, node, where: str) -> dict[str, str]:
    """The fields of a step feature's node that its batched call passes, as Python source:
    each a bool, an int or a float (never a string: no file name reaches the code), and an
    argument's value one its declaration allows."""
    out = {}
    args = {a.field: a for a in decl.args}
    for name in decl.batched.args:
        if name in STEP_NAMES:
            continue
        value, arg = getattr(node, name), args.get(name)
        if isinstance(arg, Word) and not any(type(value) is type(v) and value == v for v in arg.choices.values()):
            raise CodegenError(f"{where}: {decl.name}'s {name} must be one of {list(arg.choices.values())}, "
                               f"not {value!r}")
        if isinstance(value, bool):
            out[name] = "True" if value else "False"
        elif isinstance(arg, Int) or isinstance(value, int):
            out[name] = py_int(value)
            if isinstance(arg, Int) and int(value) < arg.lo:
                raise CodegenError(f"{where}: {decl.name} needs {name} >= {arg.lo}, not {value!r}")
        else:
            out[name] = py_float(value)
    return out
