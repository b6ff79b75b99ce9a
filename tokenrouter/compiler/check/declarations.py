"""The passes over declarations, each a function of the checker's `CheckState`: the version
header, the names (one declaration each), parameters (bound through `params.py`), models
with their `--model` bindings and serving engines, ensembles, what each model's engine
cannot give (`engines`, once every declaration is read), and, once everything else is
checked, the models' default roles, the declarations never used and `--model` bindings of
no model.

A declaration that failed is marked not ok, so uses of it stay quiet.
"""

from __future__ import annotations

import math
import os

from tokenrouter import engines as registry
from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import (BUILTIN_MODELS, DTYPES, ENSEMBLE_MODES, LANGUAGE_VERSION, QUANTS, ROLES,
                                           default_quant, looks_like_path)
from tokenrouter.compiler.check import params as check_params
from tokenrouter.compiler.check.symbols import (KIND_WORDS, CheckState, Symbol, as_int, bound_model_path,
                                                resolve_path)
from tokenrouter.compiler.features import FEATURES, HEAD_ROW, HIDDEN, called
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Note, did_you_mean, words


def header(state: CheckState) -> None:
    """The first line names the language version this tokenrouter reads."""
    h = state.file.header
    if h is None:
        first = state.file.items[0].span if state.file.items else None
        span = ir.Span(state.file.path, first.line if first else 1, first.col if first else 1,
                       first.line if first else 1, (first.col if first else 1) + 1)
        state.err("E010", "the file does not start with the language version",
                  span, hint=f"begin the file with: tokenrouter {LANGUAGE_VERSION}")
        return
    v = h.version
    if not v.is_int:
        state.err("E011", f"language version '{v.text}' is not a whole number", v.span,
                  hint=f"this tokenrouter reads version {LANGUAGE_VERSION}")
    elif v.value > LANGUAGE_VERSION:
        state.err("E011", f"language version {v.value} is newer than this tokenrouter, which reads "
                  f"version {LANGUAGE_VERSION}", v.span, hint="upgrade tokenrouter, or rewrite for version 1")
    elif v.value != LANGUAGE_VERSION:
        state.err("E011", f"unknown language version {v.value}", v.span,
                  hint=f"this tokenrouter reads version {LANGUAGE_VERSION}")


def declare(state: CheckState) -> None:
    """One symbol per name; a second declaration of a name is an error."""
    kinds = {ast.ModelDecl: "model", ast.RouterDecl: "router", ast.HeadDecl: "head",
             ast.EnsembleDecl: "ensemble", ast.ParamDecl: "param"}
    for item in state.file.items:
        kind = kinds.get(type(item))
        if kind is None:
            continue
        name = item.name.text
        if name in state.symbols:
            first = state.symbols[name]
            state.err("E101", f"'{name}' is declared twice", item.name.span,
                      hint="give each model, router, head, ensemble and parameter its own name",
                      notes=[Note(f"first declared here (as {KIND_WORDS[first.kind]})", first.span)])
            continue
        state.symbols[name] = Symbol(kind, name, item.name.span, decl=item)


def bind_params(state: CheckState) -> None:
    """Each parameter's value, and the substitution of its uses (`params.py`)."""
    decls = [i for i in state.file.items if isinstance(i, ast.ParamDecl) and state.is_first(i)]
    state.bound = check_params.bind(decls, state.given_params, state.base_dir, state.err)
    for name, b in state.bound.items():
        state.symbols[name].ok = b.ok
    state.subst = check_params.Substitution(state.bound)


def unknown_bindings(state: CheckState) -> None:
    """`--model NAME=PATH` for a name that is not a declared model."""
    models = [n for n, s in state.symbols.items() if s.kind == "model"]
    for name, path in state.model_paths.items():
        sym = state.symbols.get(name)
        if sym is not None and sym.kind == "model":
            continue
        guess = did_you_mean(name, models)
        if sym is not None:
            hint = f"'{name}' is {KIND_WORDS[sym.kind]}, not a model"
            if sym.kind == "param":
                hint += f"; set it with --set {name}=VALUE"
        else:
            hint = (f"did you mean '{guess}'?" if guess else
                    f"the models are {words(models, 'and')}" if models else "the program declares no models")
        state.err("E707", f"--model {name}={path}: the program has no model '{name}'", None, hint=hint)


def model(state: CheckState, item: ast.ModelDecl) -> None:
    """A model's attributes and path (a `--model` binding wins over the declared path)."""
    if not state.is_first(item):
        return
    sym = state.symbols[item.name.text]
    attrs = state.attrs(item.attrs, {"role": "", "dtype": "", "quant": "", "engine": "", "tensor_parallel": ""},
                        f"model '{item.name.text}'")
    role = state.choice(attrs["role"], ROLES, "role") if "role" in attrs else None
    dtype = state.choice(attrs["dtype"], DTYPES, "dtype") if "dtype" in attrs else "float32"
    quant = state.choice(attrs["quant"], QUANTS, "quant") if "quant" in attrs else None
    sym.engine = (state.choice(attrs["engine"], registry.names(), "engine") if "engine" in attrs else None) \
        or registry.DEFAULT
    if "tensor_parallel" in attrs:
        tp = as_int(attrs["tensor_parallel"].value, 1)
        if tp is None:
            state.err("E203", "tensor_parallel is the number of ranks the model is split over, a whole number >= 1",
                      attrs["tensor_parallel"].value.span)
        sym.tensor_parallel = tp or 1
    name = item.name.text
    if name in state.model_paths:  # bound by the deployment: the binding wins
        sym.model_path, sym.role, sym.dtype = bound_model_path(state.model_paths[name]), role, dtype or "float32"
        sym.quant = quant or default_quant(sym.model_path, sym.engine)
        return
    if item.path is None:
        state.err("E706", f"model '{name}' has no path and is not bound", item.name.span,
                  hint=f"bind it: --model {name}=PATH (a checkpoint folder, a .gguf file or one of "
                       f"{words(BUILTIN_MODELS)}), or give it one: model {name} = \"PATH\"")
        sym.ok = False
        return
    text = item.path.value
    if looks_like_path(text):
        path = resolve_path(text, state.base_dir)
        if not os.path.exists(path):
            state.err("W003", f"model path '{text}' does not exist", item.path.span,
                      hint="paths are relative to the .route file's folder; a model is a checkpoint "
                           f"folder, a .gguf file, or one of {words(BUILTIN_MODELS)}")
    elif text in BUILTIN_MODELS:
        path = text
    else:
        guess = did_you_mean(text, BUILTIN_MODELS)
        state.err("E104", f"'{text}' is not a built-in model", item.path.span,
                  hint=(f"did you mean '{guess}'? " if guess else f"built-in models: {words(BUILTIN_MODELS)}; ")
                  + "a checkpoint folder or .gguf file needs a path such as './" + text + "'")
        sym.ok = False
        return
    sym.model_path, sym.role, sym.dtype = path, role, dtype or "float32"
    sym.quant = quant or default_quant(path, sym.engine)


def emit_models(state: CheckState) -> None:
    """The models into `out`, after the route block. Default roles: models only used
    in ensembles are members, the start model is small, other writers large."""
    start = state.out.start
    member_models = {m for e in state.symbols.values() if e.kind == "ensemble" for m in e.members}
    writer_models = {t.source for t in state.out.transitions} | {t.dest for t in state.out.transitions}
    writer_models |= {b.writer for b in state.out.bounds} | {b.then for b in state.out.bounds if b.then}
    if start:
        writer_models.add(start)
    for sym in state.symbols.values():
        if sym.kind != "model" or not sym.ok or sym.model_path is None:
            continue
        role = sym.role
        if role is None:
            if sym.name in member_models and sym.name not in writer_models:
                role = "member"
            elif sym.name == start:
                role = "small"
            else:
                role = "large"
        state.out.models.append(ir.Model(sym.name, sym.model_path, role, sym.dtype, sym.decl.span,
                                         quant=sym.quant, engine=sym.engine, tensor_parallel=sym.tensor_parallel))


def engines(state: CheckState) -> None:
    """What a model's engine cannot give (E801), at the declaration that asks for it, read
    from the engine's capabilities (`tokenrouter/engines.py`): tensor parallelism, its weight
    formats (`quant`) and dtypes, membership of an ensemble (the members' logits meet in one
    step of one process), and what its step hands a router or head (hidden states, token
    embeddings)."""
    models = {n: s for n, s in state.symbols.items() if s.kind == "model" and s.ok}
    for name, sym in models.items():
        attrs = {a.key.text: a for a in sym.decl.attrs}
        caps = registry.capabilities(sym.engine)
        if sym.tensor_parallel > 1 and not caps.tensor_parallel:
            state.err("E801", f"model '{name}': {caps.title} has no tensor parallelism",
                      attrs["tensor_parallel"].value.span,
                      hint=f"serve it with engine = {_engines_that(lambda c: c.tensor_parallel)}, or drop "
                           "tensor_parallel")
        if sym.quant not in caps.quants:
            owner = next((r for r in registry.registered() if sym.quant in r.capabilities.quants), None)
            whose = f"a weight format of {owner.capabilities.title}, not" if owner else "not a weight format of"
            state.err("E801", f"model '{name}': quant = {sym.quant} is {whose} {caps.title}'s",
                      attrs["quant"].value.span if "quant" in attrs else sym.span,
                      hint=f"drop quant ({caps.title} runs the checkpoint's own weights), or serve it with "
                           f"engine = {owner.name}" if owner and caps.quants == ("none",) else
                      f"{caps.title} runs quant = {words(caps.quants)}")
        if sym.dtype not in caps.dtypes:
            where = attrs["dtype"].value.span if "dtype" in attrs else sym.span
            state.err("E801", f"model '{name}': {caps.title} does not run {sym.dtype}", where,
                      hint=f"expected {words(caps.dtypes)}")
    for item in state.file.items:
        if not (isinstance(item, (ast.EnsembleDecl, ast.RouterDecl, ast.HeadDecl)) and state.is_first(item)):
            continue
        if isinstance(item, ast.EnsembleDecl):
            for arg in item.members:
                sym = models.get(arg.label.text) if arg.label is not None else None
                caps = registry.capabilities(sym.engine) if sym is not None else None
                if caps is not None and not caps.ensembles:
                    state.err("E801", f"'{arg.label.text}' is served by {caps.title}, so it cannot be a member of "
                              f"ensemble '{item.name.text}'", arg.label.span,
                              hint="an ensemble's members are stepped together in one process; serve "
                                   f"'{arg.label.text}' with engine = {_engines_that(lambda c: c.ensembles)}")
        elif item.model.text in models:
            _reader(state, item, models[item.model.text].engine)


def _engines_that(can) -> str:
    """The registered engines whose capabilities pass `can`, as a hint writes them."""
    return " or ".join(r.name for r in registry.registered() if can(r.capabilities))


def _reads(feature) -> set[str]:
    """What a feature needs its engine's step to give (a head's row comes from its weights
    file, read with the final hidden state)."""
    return set(feature.reads) - {HEAD_ROW}


def _reader(state: CheckState, item, engine: str) -> None:
    """A router or head reads only what its model's engine hands out: a head the final
    hidden state, a router the features whose reads the engine gives."""
    caps = registry.capabilities(engine)
    gives = set(caps.gives)
    model = item.model.text
    given = [f.name for f in called() if _reads(f) <= gives]
    everything = _engines_that(lambda c: set(c.gives) >= set().union(*(_reads(f) for f in FEATURES.values())))
    hint = f"route on what the {' and '.join(registry.GIVES_WORDS[g] for g in caps.gives)} give " \
           f"({', '.join(given)}), or serve '{model}' with engine = {everything}"
    if isinstance(item, ast.HeadDecl):
        if HIDDEN not in gives:
            state.err("E801", f"head '{item.name.text}' reads the hidden state of '{model}', which {caps.title} "
                      "does not hand out", item.model.span, hint=hint)
        return
    inputs = next((a.value for a in item.attrs if a.key.text == "inputs"), None)
    for node in getattr(inputs, "items", ()):
        name = node.name.text if isinstance(node, ast.Ref) else node.func.text if isinstance(node, ast.Call) else ""
        if name in FEATURES and not _reads(FEATURES[name]) <= gives:
            state.err("E801", f"router '{item.name.text}' reads {name} of '{model}', which {caps.title} does "
                      "not hand out", node.span, hint=hint)


def ensemble(state: CheckState, item: ast.EnsembleDecl) -> None:
    """An ensemble's kind, members with their weights, and attributes."""
    if not state.is_first(item):
        return
    sym = state.symbols[item.name.text]
    name = item.name.text
    mode = item.mode.text
    ok = True
    if mode not in ENSEMBLE_MODES:
        guess = did_you_mean(mode, ENSEMBLE_MODES)
        state.err("E203", f"'{mode}' is not an ensemble kind", item.mode.span,
                  hint=f"did you mean '{guess}'?" if guess else f"expected {words(ENSEMBLE_MODES)}")
        ok = False
    attrs = state.attrs(item.attrs, {"topk_union": "", "seed": ""}, f"ensemble '{name}'")
    members, weights, members_ok = _members(state, item, mode)
    ok = ok and members_ok
    if ok and len(members) < 2:
        state.err("E503", f"ensemble '{name}' needs at least two members", item.name.span)
        ok = False
    if ok and not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
        state.err("E502", f"the weights of '{name}' sum to {sum(weights):g}, not 1", item.name.span,
                  hint="weights are probabilities: make them sum to 1")
        ok = False
    topk, seed, attrs_ok = _ensemble_attrs(state, attrs, mode)
    sym.members = tuple(members) or tuple(a.label.text for a in item.members if a.label)
    if not (ok and attrs_ok):
        sym.ok = False
        return
    state.out.ensembles.append(ir.Ensemble(name, tuple(members), tuple(weights), mode, topk, seed or 0,
                                           item.span))


def _members(state: CheckState, item: ast.EnsembleDecl, mode: str) -> tuple[list[str], list[float], bool]:
    """The members written `MODEL: WEIGHT`, each a model once with a weight >= 0; (members,
    weights, all well written)."""
    members, weights, seen, ok = [], [], {}, True
    for arg in item.members:
        if arg.label is None:
            state.err("E503", "each ensemble member is written `MODEL: WEIGHT`", arg.span,
                      hint=f"e.g. {mode}(a: 0.5, b: 0.5)")
            ok = False
            continue
        msym = state.lookup(arg.label, ("model",), "an ensemble member")
        if msym is None:
            ok = False
            continue
        if arg.label.text in seen:
            state.err("E503", f"'{arg.label.text}' is a member twice", arg.label.span,
                      notes=[Note("first listed here", seen[arg.label.text])])
            ok = False
            continue
        seen[arg.label.text] = arg.label.span
        if not isinstance(arg.value, ast.Num):
            state.err("E503", "a member's weight is a number", arg.value.span)
            ok = False
            continue
        if arg.value.value < 0:
            state.err("E501", f"weight {arg.value.text} of '{arg.label.text}' is negative", arg.value.span,
                      hint="weights are probabilities: each >= 0, summing to 1")
            ok = False
            continue
        members.append(arg.label.text)
        weights.append(float(arg.value.value))
    return members, weights, ok


def _ensemble_attrs(state: CheckState, attrs: dict[str, ast.Attr], mode: str) -> tuple[int | None, int | None, bool]:
    """`topk_union` (an average's) and `seed` (a mixture's); (topk, seed, both valid)."""
    topk, seed, ok = None, 0, True
    if "topk_union" in attrs:
        topk = as_int(attrs["topk_union"].value, 1)
        if topk is None:
            state.err("E203", "topk_union is a whole number >= 1", attrs["topk_union"].value.span)
            ok = False
        elif mode == "mixture":
            state.err("E203", "topk_union applies to 'average' ensembles only", attrs["topk_union"].key.span,
                      hint="a mixture samples from one member per step")
            ok = False
    if "seed" in attrs:
        seed = as_int(attrs["seed"].value, 0)
        if seed is None:
            state.err("E203", "seed is a whole number >= 0", attrs["seed"].value.span)
            ok = False
        elif mode == "average":
            state.err("E203", "seed applies to 'mixture' ensembles only", attrs["seed"].key.span,
                      hint="an average is deterministic")
            ok = False
    return topk, seed, ok


def unused(state: CheckState) -> None:
    """A warning for each declaration nothing uses (unless a name was undefined: it may be
    a misspelling of one of these)."""
    if any(d.code == "E102" for d in state.diags):
        return  # a misspelt name may have been meant as one of these
    for sym in state.symbols.values():
        if sym.name in state.used or not sym.ok:
            continue
        how = {"model": "as a writer, ensemble member or router input",
               "router": "in any condition", "head": "in any condition",
               "ensemble": "as a writer",
               "param": "in any rule, visit bound, serve setting or weights file"}[sym.kind]
        kind = "parameter" if sym.kind == "param" else sym.kind
        state.err("W002", f"{kind} '{sym.name}' is declared but never used {how}", sym.span)
