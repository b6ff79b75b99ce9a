"""The declarations' passes: the version header, the names (one declaration each),
parameters (bound through `check_params.py`), models with their `--model` bindings,
ensembles, and, once everything else is checked, the models' default roles and the
declarations never used.

A declaration that failed is marked not ok, so uses of it stay quiet.
"""

from __future__ import annotations

import math
import os

from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import (BUILTIN_MODELS, DTYPES, ENSEMBLE_MODES, LANGUAGE_VERSION, QUANTS, ROLES,
                                           looks_like_path)
from tokenrouter.compiler.check import params as check_params
from tokenrouter.compiler.check.symbols import (KIND_WORDS, CheckerBase, Symbol, as_int, bound_model_path,
                                                resolve_path)
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Note, did_you_mean, words


class DeclarationChecks(CheckerBase):
    """Mixin of the checker: the passes over declarations."""

    # ------------------------------------------------------------------ header
    def header(self):
        h = self.file.header
        if h is None:
            first = self.file.items[0].span if self.file.items else None
            span = ir.Span(self.file.path, first.line if first else 1, first.col if first else 1,
                           first.line if first else 1, (first.col if first else 1) + 1)
            self.err("E010", "the file does not start with the language version",
                     span, hint=f"begin the file with: tokenrouter {LANGUAGE_VERSION}")
            return
        v = h.version
        if not v.is_int:
            self.err("E011", f"language version '{v.text}' is not a whole number", v.span,
                     hint=f"this tokenrouter reads version {LANGUAGE_VERSION}")
        elif v.value > LANGUAGE_VERSION:
            self.err("E011", f"language version {v.value} is newer than this tokenrouter, which reads "
                     f"version {LANGUAGE_VERSION}", v.span, hint="upgrade tokenrouter, or rewrite for version 1")
        elif v.value != LANGUAGE_VERSION:
            self.err("E011", f"unknown language version {v.value}", v.span,
                     hint=f"this tokenrouter reads version {LANGUAGE_VERSION}")

    # ------------------------------------------------------------ declarations
    def declare(self):
        kinds = {ast.ModelDecl: "model", ast.RouterDecl: "router", ast.HeadDecl: "head",
                 ast.EnsembleDecl: "ensemble", ast.ParamDecl: "param"}
        for item in self.file.items:
            kind = kinds.get(type(item))
            if kind is None:
                continue
            name = item.name.text
            if name in self.symbols:
                first = self.symbols[name]
                self.err("E101", f"'{name}' is declared twice", item.name.span,
                         hint="give each model, router, head, ensemble and parameter its own name",
                         notes=[Note(f"first declared here (as {KIND_WORDS[first.kind]})", first.span)])
                continue
            self.symbols[name] = Symbol(kind, name, item.name.span, decl=item)

    # -------------------------------------------------------------- parameters
    def params(self):
        decls = [i for i in self.file.items if isinstance(i, ast.ParamDecl) and self.is_first(i)]
        self.bound = check_params.bind(decls, self.given_params, self.base_dir, self.err)
        for name, b in self.bound.items():
            self.symbols[name].ok = b.ok
        self.subst = check_params.Substitution(self.bound)

    def unknown_bindings(self):
        """`--model NAME=PATH` for a name that is not a declared model."""
        models = [n for n, s in self.symbols.items() if s.kind == "model"]
        for name, path in self.model_paths.items():
            sym = self.symbols.get(name)
            if sym is not None and sym.kind == "model":
                continue
            guess = did_you_mean(name, models)
            hint = (f"'{name}' is {KIND_WORDS[sym.kind]}, not a model" + (
                f"; set it with --set {name}=VALUE" if sym.kind == "param" else "") if sym is not None else
                f"did you mean '{guess}'?" if guess else
                f"the models are {words(models, 'and')}" if models else "the program declares no models")
            self.err("E707", f"--model {name}={path}: the program has no model '{name}'", None, hint=hint)

    # ------------------------------------------------------------------ models
    def model(self, item: ast.ModelDecl):
        if not self.is_first(item):
            return
        sym = self.symbols[item.name.text]
        attrs = self.attrs(item.attrs, {"role": "", "dtype": "", "quant": ""}, f"model '{item.name.text}'")
        role = self.choice(attrs["role"], ROLES, "role") if "role" in attrs else None
        dtype = self.choice(attrs["dtype"], DTYPES, "dtype") if "dtype" in attrs else "float32"
        quant = self.choice(attrs["quant"], QUANTS, "quant") if "quant" in attrs else "none"
        name = item.name.text
        if name in self.model_paths:  # bound by the deployment: the binding wins
            sym.model_path, sym.role, sym.dtype = bound_model_path(self.model_paths[name]), role, dtype or "float32"
            sym.quant = quant or "none"
            return
        if item.path is None:
            self.err("E706", f"model '{name}' has no path and is not bound", item.name.span,
                     hint=f"bind it: --model {name}=PATH (a checkpoint folder, a .gguf file or one of "
                          f"{words(BUILTIN_MODELS)}), or give it one: model {name} = \"PATH\"")
            sym.ok = False
            return
        text = item.path.value
        if looks_like_path(text):
            path = resolve_path(text, self.base_dir)
            if not os.path.exists(path):
                self.err("W003", f"model path '{text}' does not exist", item.path.span,
                         hint="paths are relative to the .route file's folder; a model is a checkpoint "
                              f"folder, a .gguf file, or one of {words(BUILTIN_MODELS)}")
        elif text in BUILTIN_MODELS:
            path = text
        else:
            guess = did_you_mean(text, BUILTIN_MODELS)
            self.err("E104", f"'{text}' is not a built-in model", item.path.span,
                     hint=(f"did you mean '{guess}'? " if guess else f"built-in models: {words(BUILTIN_MODELS)}; ")
                     + "a checkpoint folder or .gguf file needs a path such as './" + text + "'")
            sym.ok = False
            return
        sym.model_path, sym.role, sym.dtype, sym.quant = path, role, dtype or "float32", quant or "none"

    # ---------------------------------------------------------- default roles
    def emit_models(self):
        """The models into `out`, after the route block. Default roles: models only used
        in ensembles are members, the start model is small, other writers large."""
        start = self.out.start
        member_models = {m for e in self.symbols.values() if e.kind == "ensemble" for m in e.members}
        writer_models = {t.source for t in self.out.transitions} | {t.dest for t in self.out.transitions}
        writer_models |= {b.writer for b in self.out.bounds} | {b.then for b in self.out.bounds if b.then}
        if start:
            writer_models.add(start)
        for sym in self.symbols.values():
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
            self.out.models.append(ir.Model(sym.name, sym.model_path, role, sym.dtype, sym.decl.span,
                                            quant=sym.quant))

    # --------------------------------------------------------------- ensembles
    def ensemble(self, item: ast.EnsembleDecl):
        if not self.is_first(item):
            return
        sym = self.symbols[item.name.text]
        name = item.name.text
        mode = item.mode.text
        ok = True
        if mode not in ENSEMBLE_MODES:
            guess = did_you_mean(mode, ENSEMBLE_MODES)
            self.err("E203", f"'{mode}' is not an ensemble kind", item.mode.span,
                     hint=f"did you mean '{guess}'?" if guess else f"expected {words(ENSEMBLE_MODES)}")
            ok = False
        allowed = {"topk_union": "", "seed": ""}
        attrs = self.attrs(item.attrs, allowed, f"ensemble '{name}'")
        members, weights, seen = [], [], {}
        for arg in item.members:
            if arg.label is None:
                self.err("E503", "each ensemble member is written `MODEL: WEIGHT`", arg.span,
                         hint=f"e.g. {mode}(a: 0.5, b: 0.5)")
                ok = False
                continue
            msym = self.lookup(arg.label, ("model",), "an ensemble member")
            if msym is None:
                ok = False
                continue
            if arg.label.text in seen:
                self.err("E503", f"'{arg.label.text}' is a member twice", arg.label.span,
                         notes=[Note("first listed here", seen[arg.label.text])])
                ok = False
                continue
            seen[arg.label.text] = arg.label.span
            if not isinstance(arg.value, ast.Num):
                self.err("E503", "a member's weight is a number", arg.value.span)
                ok = False
                continue
            if arg.value.value < 0:
                self.err("E501", f"weight {arg.value.text} of '{arg.label.text}' is negative", arg.value.span,
                         hint="weights are probabilities: each >= 0, summing to 1")
                ok = False
                continue
            members.append(arg.label.text)
            weights.append(float(arg.value.value))
        if ok and len(members) < 2:
            self.err("E503", f"ensemble '{name}' needs at least two members", item.name.span)
            ok = False
        if ok and not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
            self.err("E502", f"the weights of '{name}' sum to {sum(weights):g}, not 1", item.name.span,
                     hint="weights are probabilities: make them sum to 1")
            ok = False
        topk, seed = None, 0
        if "topk_union" in attrs:
            topk = as_int(attrs["topk_union"].value, 1)
            if topk is None:
                self.err("E203", "topk_union is a whole number >= 1", attrs["topk_union"].value.span)
                ok = False
            elif mode == "mixture":
                self.err("E203", "topk_union applies to 'average' ensembles only", attrs["topk_union"].key.span,
                         hint="a mixture samples from one member per step")
                ok = False
        if "seed" in attrs:
            seed = as_int(attrs["seed"].value, 0)
            if seed is None:
                self.err("E203", "seed is a whole number >= 0", attrs["seed"].value.span)
                ok = False
            elif mode == "average":
                self.err("E203", "seed applies to 'mixture' ensembles only", attrs["seed"].key.span,
                         hint="an average is deterministic")
                ok = False
        sym.members = tuple(members) or tuple(a.label.text for a in item.members if a.label)
        if not ok:
            sym.ok = False
            return
        self.out.ensembles.append(ir.Ensemble(name, tuple(members), tuple(weights), mode, topk, seed or 0,
                                              item.span))

    # ------------------------------------------------------------------ unused
    def unused(self):
        if any(d.code == "E102" for d in self.diags):
            return  # a misspelt name may have been meant as one of these
        for sym in self.symbols.values():
            if sym.name in self.used or not sym.ok:
                continue
            how = {"model": "as a writer, ensemble member or router input",
                   "router": "in any condition", "head": "in any condition",
                   "ensemble": "as a writer",
                   "param": "in any rule, visit bound, serve setting or weights file"}[sym.kind]
            kind = "parameter" if sym.kind == "param" else sym.kind
            self.err("W002", f"{kind} '{sym.name}' is declared but never used {how}", sym.span)
