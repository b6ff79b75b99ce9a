"""Name resolution and semantic checks of a parsed .route file, as a sequence of passes.

Passes: version header; declarations (duplicates, kinds); parameters (bound to their
`--set` values or defaults, then substituted where they are used, check_params.py);
models (with their `--model` bindings), routers, heads and ensembles (attributes, paths, weights); the route block (start, transitions with their
conditions, visit bounds); whole-program analysis (reachability, shadowed rules, ping-pong,
unused declarations); the serve block. Every problem is reported (in source order, once
sorted), and the result is a `Checked` program in IR terms that `lower.py` assembles into
an `ir.Program`. A declaration that failed is marked not ok, so uses of it stay quiet.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import (ACTIVATIONS, ROUTER_ARCHS, BUILTIN_MODELS, DTYPES, ENSEMBLE_MODES,
                                           LANGUAGE_VERSION, QUANTS, ROLES, ROUTER_INPUTS, SERVE_KEYS,
                                           looks_like_path)
from tokenrouter.compiler import check_params
from tokenrouter.compiler.check_expr import ExprChecker
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note, did_you_mean, sort_diagnostics, words

KIND_WORDS = {"model": "a model", "router": "a router", "head": "a head", "ensemble": "an ensemble",
              "param": "a parameter"}


@dataclass
class Symbol:
    kind: str  # model | router | head | ensemble
    name: str
    span: Any
    ok: bool = True
    model: str = ""  # router/head: the model it reads
    file: str = ""  # router/head: weights file (resolved)
    sigmoid: bool = True
    members: tuple[str, ...] = ()  # ensemble
    decl: Any = None  # the declaration that introduced the name
    model_path: str | None = None  # model: resolved path or built-in name
    role: str | None = None
    dtype: str = "float32"
    quant: str = "none"


@dataclass
class Checked:
    """A checked program in IR terms; router input dims are filled by `lower.py`."""

    path: str
    base_dir: str
    language_version: int
    models: list[ir.Model] = field(default_factory=list)
    start: str | None = None
    transitions: list[ir.Transition] = field(default_factory=list)
    bounds: list[ir.VisitBound] = field(default_factory=list)
    ensembles: list[ir.Ensemble] = field(default_factory=list)
    routers: list[ir.RouterNet] = field(default_factory=list)
    schedule: ir.Schedule = field(default_factory=ir.Schedule)
    params: list[ir.Param] = field(default_factory=list)


def resolve_path(text: str, base_dir: str) -> str:
    """A path as written, made absolute relative to the .route file's folder."""
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(text)))


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


def _as_int(node, minimum: int) -> int | None:
    if isinstance(node, ast.Num) and node.is_int and node.value >= minimum:
        return int(node.value)
    return None


def _word(node) -> str | None:
    return node.name.text if isinstance(node, ast.Ref) else None


def bound_model_path(text: str) -> str:
    """A `--model` binding: a built-in name as it is, a path made absolute against the
    working directory."""
    if text in BUILTIN_MODELS and not os.path.exists(text):
        return text
    return os.path.abspath(os.path.expanduser(text))


class _Checker:
    def __init__(self, file: ast.File, base_dir: str, params: dict[str, str] | None = None,
                 model_paths: dict[str, str] | None = None):
        self.file, self.base_dir = file, base_dir
        self.given_params = params or {}
        self.model_paths = model_paths or {}
        self.bound: dict[str, check_params.Bound] = {}
        self.subst = check_params.Substitution({})
        self.diags: list[Diagnostic] = []
        self.symbols: dict[str, Symbol] = {}
        self.used: set[str] = set()
        self.reported_undefined: set[str] = set()
        self.route_stmts: tuple = ()
        self.out = Checked(file.path, base_dir, LANGUAGE_VERSION)

    def err(self, code, message, span, hint=None, notes=()):
        note = self.subst.note(span) if span is not None else None
        notes = tuple(notes) + ((note,) if note else ())
        self.diags.append(Diagnostic(code, message, span, hint, notes))

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
            self.err("E101", f"a second '{what}' block", _head_span(dup, what),
                     hint=f"a program has one '{what}' block; merge them",
                     notes=[Note("first declared here", _head_span(first, what))])
        if routes:
            self.route(self.subst.route(routes[0]))
        else:
            end = self.file.header.span if self.file.header else ir.Span(self.file.path, 1, 1, 1, 2)
            self.err("E407", "the program has no 'route' block", end,
                     hint="add: route { start MODEL }")
        self.analyse()
        if serves:
            self.serve(self.subst.serve(serves[0]))
        self.used |= self.subst.used
        self.unused()
        check_params.unknown_settings(self.given_params, self.bound, self.symbols, self.err)
        self.unknown_bindings()
        self.out.params = [check_params.to_ir(b) for b in self.bound.values() if b.ok]
        return self.out

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
        decls = [i for i in self.file.items if isinstance(i, ast.ParamDecl) and self._is_first(i)]
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

    def _is_first(self, item) -> bool:
        sym = self.symbols.get(item.name.text)
        return sym is not None and sym.decl is item

    def attrs(self, attrs, allowed: dict[str, str], what: str) -> dict[str, ast.Attr]:
        """Unknown and duplicate attributes; returns key -> attr for the valid ones."""
        seen: dict[str, ast.Attr] = {}
        for attr in attrs:
            key = attr.key.text
            if key not in allowed:
                guess = did_you_mean(key, allowed)
                self.err("E201", f"unknown attribute '{key}' for {what}", attr.key.span,
                         hint=(f"did you mean '{guess}'?" if guess else
                               f"expected {words(allowed) if allowed else 'no attributes'}"))
                continue
            if key in seen:
                self.err("E202", f"attribute '{key}' is given twice", attr.key.span,
                         notes=[Note("first given here", seen[key].key.span)])
                continue
            seen[key] = attr
        return seen

    def choice(self, attr: ast.Attr, options, what: str) -> str | None:
        word = _word(attr.value)
        if word in options:
            return word
        shown = f"'{word}'" if word else "this value"
        guess = did_you_mean(word, options) if word else None
        self.err("E203", f"{shown} is not a valid {what}", attr.value.span,
                 hint=f"did you mean '{guess}'?" if guess else f"expected {words(options)}")
        return None

    def lookup(self, name: ast.Name, kinds: tuple[str, ...], role: str, avoid: str = "") -> Symbol | None:
        """Resolve a name that must be of one of `kinds`; E102/E103 otherwise."""
        sym = self.symbols.get(name.text)
        if sym is None:
            if name.text in self.reported_undefined:
                return None  # one report per undefined name: no cascades
            self.reported_undefined.add(name.text)
            cands = [n for n, s in self.symbols.items() if s.kind in kinds]
            guess = did_you_mean(name.text, [c for c in cands if c != avoid])
            kind_words = " or ".join(k for k in kinds)
            self.err("E102", f"undefined {kind_words} '{name.text}'", name.span,
                     hint=f"did you mean '{guess}'?" if guess else
                     (f"declared: {words(cands, 'and')}" if cands else f"declare it first: {kinds[0]} {name.text} = ..."))
            return None
        self.used.add(name.text)
        if sym.kind not in kinds:
            self.err("E103", f"{role} must be {' or '.join(KIND_WORDS[k] for k in kinds)}, but '{name.text}' "
                     f"is {KIND_WORDS[sym.kind]}", name.span, notes=[Note("declared here", sym.span)])
            return None
        return sym

    # ------------------------------------------------------------------ models
    def model(self, item: ast.ModelDecl):
        if not self._is_first(item):
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

    def _emit_models(self, writer_models: set[str], start: str | None, member_models: set[str]):
        """Default roles: models only used in ensembles are members, the start model is
        small, other writers large."""
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

    # ----------------------------------------------------------------- routers
    def _reader(self, item, what: str) -> Symbol | None:
        if not self._is_first(item):
            return None
        sym = self.symbols[item.name.text]
        target = self.lookup(item.model, ("model",), f"the model a {what} reads")
        if target is None:
            sym.ok = False
            return None
        sym.model = item.model.text
        if isinstance(item.path, ast.Ref):
            sym.file = self.file_param(item.path, what)
            if sym.file is None:
                sym.ok = False
                return None
            return sym
        if not item.path.value.strip():
            self.err("E203", f"the {what}'s weights file is empty", item.path.span,
                     hint='name a safetensors file, e.g. "weights/router.safetensors"')
            sym.ok = False
            return None
        sym.file = resolve_path(item.path.value, self.base_dir)
        return sym

    def value_ok(self, node, words_ok: tuple[str, ...] = ()) -> bool:
        """False (after reporting an undefined name once) when `node` is a name that is
        not a bound parameter: a misspelt parameter, or one whose value was invalid
        (already reported, so the use stays quiet)."""
        if not isinstance(node, ast.Ref) or node.name.text in words_ok:
            return True
        name = node.name.text
        sym = self.symbols.get(name)
        if sym is not None and sym.kind == "param":
            return False  # not substituted: its value is invalid and was reported
        if sym is not None:
            return True  # the value check says what is wrong with a model name here
        if name not in self.reported_undefined:
            self.reported_undefined.add(name)
            guess = did_you_mean(name, list(self.bound))
            self.err("E102", f"undefined name '{name}'", node.span,
                     hint=f"did you mean '{guess}'?" if guess else
                     "a value here is a literal or the name of a parameter (param NAME: TYPE = ...)")
        return False

    def file_param(self, ref: ast.Ref, what: str) -> str | None:
        """A weights file given by a `path` parameter: its bound (absolute) path."""
        name = ref.name.text
        sym = self.symbols.get(name)
        if sym is None:
            guess = did_you_mean(name, [n for n, b in self.bound.items() if b.type == "path"])
            self.err("E102", f"undefined parameter '{name}'", ref.span,
                     hint=f"did you mean '{guess}'?" if guess else
                     f'the {what}\'s weights file is a string ("weights/x.safetensors") or a path parameter: '
                     f'param {name}: path = "..."')
            return None
        self.used.add(name)
        if sym.kind != "param":
            self.err("E103", f"the {what}'s weights file must be a string or a path parameter, but '{name}' is "
                     f"{KIND_WORDS[sym.kind]}", ref.span, notes=[Note("declared here", sym.span)])
            return None
        b = self.bound[name]
        if not b.ok:
            return None
        if b.type != "path":
            self.err("E304", f"the {what}'s weights file must be a path parameter, but '{name}' is a {b.type}",
                     ref.span, notes=[Note("declared here", b.decl.span)])
            return None
        return b.value

    def router(self, item: ast.RouterDecl):
        sym = self._reader(item, "router")
        attrs = self.attrs(item.attrs, {"inputs": "", "activation": "", "output": "", "arch": ""},
                           f"router '{item.name.text}'")
        if sym is None:
            return
        activation = self.choice(attrs["activation"], ACTIVATIONS, "activation") if "activation" in attrs else "relu"
        arch = self.choice(attrs["arch"], ROUTER_ARCHS, "router architecture") if "arch" in attrs else "mlp"
        if arch == "citer" and activation not in (None, "relu"):
            self.err("E203", "CITER's classifier uses relu", attrs["activation"].value.span,
                     hint="drop the activation, or declare arch = mlp")
            activation = None
        if arch in ("citer", "r2r") and "output" in attrs:
            self.err("E203", f"an {arch} router has one output; 'output' applies to arch = mlp",
                     attrs["output"].key.span)
            arch = None
        output = 0
        if "output" in attrs:
            output = _as_int(attrs["output"].value, 0)
            if output is None:
                self.err("E203", "output is the index of the router's output to read, a whole number >= 0",
                         attrs["output"].value.span)
        if "inputs" not in attrs:
            self.err("E204", f"router '{item.name.text}' does not declare its inputs", item.name.span,
                     hint="add: { inputs = [hidden(-1), token_embedding, topk_logits(100)] }")
            sym.ok = False
            return
        inputs = self.router_inputs(attrs["inputs"].value, sym.model)
        if inputs is None or activation is None or output is None or arch is None:
            sym.ok = False
            return
        self.out.routers.append(ir.RouterNet(sym.name, sym.model, sym.file, tuple(inputs), activation,
                                             output, item.span, arch))

    def router_inputs(self, value, model: str) -> list | None:
        if not isinstance(value, ast.ListLit) or not value.items:
            self.err("E306", "inputs is a non-empty list of router inputs", value.span,
                     hint=f"expected a list of {words(ROUTER_INPUTS.values())}")
            return None
        out, ok = [], True
        for node in value.items:
            inp = self.router_input(node, model)
            ok = ok and inp is not None
            out.append(inp)
        return out if ok else None

    def router_input(self, node, model: str):
        if isinstance(node, ast.Ref):
            name, args = node.name.text, ()
        elif isinstance(node, ast.Call):
            name, args = node.func.text, node.args
        else:
            self.err("E306", "not a router input", node.span,
                     hint=f"expected one of {words(ROUTER_INPUTS.values())}")
            return None
        if name not in ROUTER_INPUTS:
            guess = did_you_mean(name, ROUTER_INPUTS)
            self.err("E306", f"unknown router input '{name}'", node.span,
                     hint=f"did you mean '{ROUTER_INPUTS[guess]}'?" if guess else
                     f"expected one of {words(ROUTER_INPUTS.values())}")
            return None
        want = {"hidden": 1, "topk_logits": 1, "entropy": 1}.get(name, 0)
        if len(args) != want or any(a.label is not None for a in args):
            self.err("E302", f"router input {name} takes {want} argument{'s' if want != 1 else ''}, got {len(args)}",
                     node.span, hint=f"write {ROUTER_INPUTS[name]} (the router's model is implied)")
            return None
        if name == "hidden":
            layer = args[0].value
            if not (isinstance(layer, ast.Num) and layer.is_int and layer.value >= -1):
                self.err("E306", "hidden(LAYER) takes a layer number >= -1", layer.span,
                         hint="0 = the embeddings, N = after decoder layer N, -1 = after the final norm")
                return None
            return ir.InputHidden(int(layer.value), 0)
        if name == "token_embedding":
            return ir.InputTokenEmbedding(0)
        if name == "topk_logits":
            k = _as_int(args[0].value, 1)
            if k is None:
                self.err("E306", "topk_logits(K) takes a whole number K >= 1", args[0].value.span)
                return None
            return ir.InputTopkLogits(k)
        if name == "entropy":
            kind = _word(args[0].value)
            if kind not in ("normalized", "raw"):
                self.err("E303", "entropy takes `normalized` or `raw`", args[0].value.span)
                return None
            return ir.InputScalar(ir.Entropy(model, kind == "normalized", node.span))
        return ir.InputScalar(ir.TopProb(model, node.span) if name == "top_prob" else ir.Margin(model, node.span))

    def head(self, item: ast.HeadDecl):
        sym = self._reader(item, "head")
        attrs = self.attrs(item.attrs, {"sigmoid": ""}, f"head '{item.name.text}'")
        if sym is None:
            return
        if "sigmoid" in attrs:
            choice = self.choice(attrs["sigmoid"], ("true", "false"), "value for sigmoid")
            if choice is None:
                sym.ok = False
                return
            sym.sigmoid = choice == "true"

    # --------------------------------------------------------------- ensembles
    def ensemble(self, item: ast.EnsembleDecl):
        if not self._is_first(item):
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
            topk = _as_int(attrs["topk_union"].value, 1)
            if topk is None:
                self.err("E203", "topk_union is a whole number >= 1", attrs["topk_union"].value.span)
                ok = False
            elif mode == "mixture":
                self.err("E203", "topk_union applies to 'average' ensembles only", attrs["topk_union"].key.span,
                         hint="a mixture samples from one member per step")
                ok = False
        if "seed" in attrs:
            seed = _as_int(attrs["seed"].value, 0)
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

    # ------------------------------------------------------------------- route
    def writer(self, name: ast.Name, role: str, avoid: str = "") -> Symbol | None:
        return self.lookup(name, ("model", "ensemble"), role, avoid)

    def running(self, sym: Symbol) -> tuple[str, ...]:
        return (sym.name,) + tuple(sym.members) if sym.kind == "ensemble" else (sym.name,)

    def route(self, block: ast.RouteBlock):
        exprs = ExprChecker(self.symbols, self.err, self.used, self.reported_undefined)
        starts = [s for s in block.stmts if isinstance(s, ast.Start)]
        if not starts:
            self.err("E401", "the route block does not say which writer starts", _head_span(block, "route"),
                     hint="add: start MODEL")
        for dup in starts[1:]:
            self.err("E402", "a second 'start'", dup.span, hint="a program has one start writer",
                     notes=[Note("first start here", starts[0].span)])
        if starts:
            sym = self.writer(starts[0].writer, "the start writer")
            if sym is not None and sym.ok:
                self.out.start = sym.name
        self.rules = []  # (ast.Transition, ir.Transition or None, Val)
        self.route_stmts = block.stmts
        visits: dict[str, ast.Visit] = {}
        for stmt in block.stmts:
            if isinstance(stmt, ast.Transition):
                self.transition(stmt, exprs)
            elif isinstance(stmt, ast.Visit):
                self.visit(stmt, visits)

    def transition(self, stmt: ast.Transition, exprs: ExprChecker):
        src = self.writer(stmt.source, "the source of a rule")
        dst = self.writer(stmt.dest, "the destination of a rule", avoid=stmt.source.text)
        if src is not None and dst is not None and src.name == dst.name:
            self.err("E404", f"rule hands '{src.name}' off to itself", stmt.dest.span,
                     hint="a rule moves the request to another writer; to keep writing, just leave it out")
            return
        if src is None or not src.ok:
            return
        val = exprs.condition(stmt.when, self.running(src), src.name)
        if dst is None or not dst.ok or val.type == "bad":
            self.rules.append((stmt, None, val))
            return
        tr = ir.Transition(src.name, dst.name, val.ir, stmt.action.text, stmt.span)
        self.rules.append((stmt, tr, val))
        self.out.transitions.append(tr)

    def visit(self, stmt: ast.Visit, visits: dict):
        sym = self.writer(stmt.writer, "a visit bound's writer")
        if sym is None:
            return
        if sym.name in visits:
            self.err("E406", f"'{sym.name}' has two visit bounds", stmt.writer.span,
                     hint="put min, max and then in one statement",
                     notes=[Note("first bound here", visits[sym.name].span)])
            return
        visits[sym.name] = stmt
        found: dict[str, ast.VisitClause] = {}
        ok = True
        for clause in stmt.clauses:
            key = clause.key.text
            if key in found:
                self.err("E406", f"'{key}' is given twice", clause.key.span,
                         notes=[Note("first given here", found[key].key.span)])
                ok = False
                continue
            found[key] = clause
        lo, hi, then = 1, None, None
        if "min" in found:
            lo = _as_int(found["min"].value, 1)
            if lo is None:
                if self.value_ok(found["min"].value):
                    self.err("E406", "min is a whole number of tokens >= 1", found["min"].value.span)
                ok = False
        if "max" in found:
            hi = _as_int(found["max"].value, 1)
            if hi is None:
                if self.value_ok(found["max"].value):
                    self.err("E406", "max is a whole number of tokens >= 1", found["max"].value.span)
                ok = False
        if "then" in found:
            tsym = self.writer(found["then"].value, "the writer after 'max'")
            if tsym is None:
                ok = False
            elif tsym.name == sym.name:
                self.err("E406", f"'then' names '{sym.name}' itself", found["then"].value.span,
                         hint="after its max a writer hands over to another writer")
                ok = False
            else:
                then = tsym.name
        if ok and lo is not None and hi is not None and lo > hi:
            self.err("E406", f"min {lo} is larger than max {hi}", found["min"].span)
            ok = False
        if ok and "max" in found and "then" not in found:
            self.err("E406", f"after max {hi} tokens, '{sym.name}' needs a writer to go to", found["max"].span,
                     hint=f"add: then WRITER, e.g. visit {sym.name} max {hi} then OTHER")
            ok = False
        if ok and "then" in found and "max" not in found:
            self.err("E406", "'then' needs a 'max'", found["then"].span,
                     hint=f"e.g. visit {sym.name} max 1 then {then}")
            ok = False
        if ok and sym.ok:
            self.out.bounds.append(ir.VisitBound(sym.name, lo or 1, hi, then, stmt.span))

    # ---------------------------------------------------------------- analysis
    def analyse(self):
        rules = getattr(self, "rules", [])
        start = self.out.start
        member_models = {m for e in self.symbols.values() if e.kind == "ensemble" for m in e.members}
        writers_used = {t.source for t in self.out.transitions} | {t.dest for t in self.out.transitions}
        writers_used |= {b.writer for b in self.out.bounds} | {b.then for b in self.out.bounds if b.then}
        if start:
            writers_used.add(start)
        self._emit_models(writers_used, start, member_models)
        if start is not None and not any(d.code in ("E102", "E103") for d in self.diags):
            self.reachability(start)
        self.shadowing(rules)
        self.ping_pong(rules)

    def reachability(self, start: str):
        """Edges come from every rule and bound as written, valid or not, so a mistake in
        one rule does not make others look unreachable."""
        edges: dict[str, set[str]] = {}
        writers = {n for n, s in self.symbols.items() if s.kind in ("model", "ensemble")}
        for stmt in self.route_stmts:
            if isinstance(stmt, ast.Transition):
                src, dst = stmt.source.text, stmt.dest.text
            elif isinstance(stmt, ast.Visit):
                then = [c.value for c in stmt.clauses if c.key.text == "then" and isinstance(c.value, ast.Name)]
                src, dst = stmt.writer.text, (then[0].text if then else None)
            else:
                continue
            if src in writers and dst in writers:
                edges.setdefault(src, set()).add(dst)
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        for stmt in self.route_stmts:
            if isinstance(stmt, ast.Transition) and stmt.source.text in writers and stmt.source.text not in seen:
                self.err("E405", f"unreachable rule: no rule leads from start '{start}' to '{stmt.source.text}'",
                         stmt.source.span, hint=f"add a rule into '{stmt.source.text}', or remove this one")
            elif isinstance(stmt, ast.Visit) and stmt.writer.text in writers and stmt.writer.text not in seen:
                self.err("E405", f"unreachable visit bound: no rule leads from start '{start}' to "
                         f"'{stmt.writer.text}'", stmt.writer.span)

    def shadowing(self, rules):
        earlier: dict[str, list] = {}
        for stmt, tr, val in rules:
            if tr is None:
                continue
            for prev_stmt, prev_val in earlier.get(tr.source, []):
                same = prev_stmt.when == stmt.when
                covered = (prev_val.simple is not None and val.simple is not None
                           and prev_val.simple[0] == val.simple[0]
                           and prev_val.simple[1].contains(val.simple[1]))
                if same or covered:
                    why = ("it has the same condition as" if same else
                           "whenever it holds, so does")
                    self.err("E405", f"unreachable rule: {why} an earlier rule out of '{tr.source}', "
                             "which is tried first", stmt.span,
                             hint="rules are tried in order and the first that holds wins; reorder or remove",
                             notes=[Note("the earlier rule", prev_stmt.span)])
                    break
            earlier.setdefault(tr.source, []).append((stmt, val))

    def ping_pong(self, rules):
        simple = [(stmt, tr, val) for stmt, tr, val in rules if tr is not None and val.simple is not None
                  and val.simple[0].comparable_across_models() and val.simple[0].model == tr.source]
        by_pair: dict[tuple[str, str], list] = {}
        for item in simple:
            by_pair.setdefault((item[1].source, item[1].dest), []).append(item)
        for (a, b), ups in by_pair.items():
            for stmt_back, tr_back, val_back in by_pair.get((b, a), []):
                for stmt_up, tr_up, val_up in ups:
                    if stmt_up.span.line > stmt_back.span.line or (
                            stmt_up.span.line == stmt_back.span.line and stmt_up.span.col > stmt_back.span.col):
                        continue  # report each pair once, at the later rule
                    f_up, i_up = val_up.simple
                    f_back, i_back = val_back.simple
                    if f_up.kind != f_back.kind or not i_up.intersects(i_back):
                        continue
                    self.diags.append(Diagnostic(
                        "W001", f"ping-pong: '{a}' hands off to '{b}' when its {_FEATURE_WORDS[f_up.kind]} is in "
                        f"{i_up.show()}, and '{b}' hands back when its own is in {i_back.show()}; "
                        "the ranges overlap", stmt_back.span,
                        hint="make the switch-back range disjoint from the switch-up range "
                             "(e.g. up when > tau, back when <= tau)",
                        notes=(Note("the switch-up rule", stmt_up.span),)))

    # ------------------------------------------------------------------- serve
    def serve(self, block: ast.ServeBlock):
        seen: dict[tuple[str, str | None], ast.ServeEntry] = {}
        sched: dict[str, Any] = {"batch": {}, "max_wait": {}, "place": {}, "threads": {}}
        globals_: dict[str, tuple[int, ...]] = {}
        model_names = [m.name for m in self.out.models]
        for entry in block.entries:
            key = entry.key.text
            if key not in SERVE_KEYS:
                guess = did_you_mean(key, SERVE_KEYS)
                self.err("E601", f"unknown serving key '{key}'", entry.key.span,
                         hint=f"did you mean '{guess}'?" if guess else f"expected one of {words(SERVE_KEYS)}")
                continue
            scope = SERVE_KEYS[key]
            target = None
            if entry.target is not None:
                if scope == "global":
                    self.err("E602", f"'{key}' applies to every model, not to one", entry.target.span,
                             hint=f"write: {key} = ...")
                    continue
                tsym = self.lookup(entry.target, ("model",), f"the model '{key}' applies to")
                if tsym is None:
                    continue
                target = tsym.name
            ident = (key, target)
            if ident in seen:
                self.err("E603", f"'{key}{' ' + target if target else ''}' is set twice", entry.key.span,
                         notes=[Note("first set here", seen[ident].key.span)])
                continue
            seen[ident] = entry
            if not self.value_ok(entry.value, ("auto",)):
                continue
            value = self.serve_value(key, entry.value)
            if value is None:
                continue
            if scope == "global":
                globals_[key] = value
            else:
                sched[key][target] = value
        def per_model(key):
            table = sched[key]
            out = []
            for name in model_names:
                if name in table:
                    out.append((name, table[name]))
                elif None in table:
                    out.append((name, table[None]))
            return tuple(out)
        self.out.schedule = ir.Schedule(
            batch=per_model("batch"), max_wait_ms=per_model("max_wait"),
            graph_batch_sizes=globals_.get("graph_batch_sizes", ()), graph_tokens=globals_.get("graph_tokens", ()),
            placement=per_model("place"), threads=per_model("threads"), span=block.span)

    def serve_value(self, key: str, node):
        if key == "batch":
            if _word(node) == "auto":
                return "auto"
            n = _as_int(node, 1)
            if n is None:
                self.err("E602", "batch is a whole number >= 1 or `auto`", node.span,
                         hint="`auto` lets the tuner choose the delayed-batching threshold")
            return n
        if key == "max_wait":
            if isinstance(node, ast.Duration) and node.ms >= 0:
                return float(node.ms)
            self.err("E602", "max_wait is a duration", node.span, hint="write it with a unit: 20ms, 1s, 500us")
            return None
        if key == "threads":
            n = _as_int(node, 0)
            if n is None:
                self.err("E602", "threads is a whole number >= 0 (0 = torch's default)", node.span)
            return n
        if key == "place":
            text = node.value if isinstance(node, ast.Str) else None
            if text is not None and _valid_place(text):
                return text
            self.err("E602", "place is a device or an address", node.span,
                     hint='expected "cpu", "cuda", "cuda:N" or "host:port"')
            return None
        # graph buckets
        if isinstance(node, ast.ListLit) and node.items:
            values = [_as_int(v, 1) for v in node.items]
            if all(v is not None for v in values) and all(a < b for a, b in zip(values, values[1:])):
                return tuple(values)
        self.err("E602", f"{key} is a list of whole numbers >= 1 in increasing order", node.span,
                 hint="e.g. [1, 2, 4, 8]")
        return None

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


_FEATURE_WORDS = {"entropy/normalized": "normalized entropy", "entropy/raw": "raw entropy",
                  "top_prob": "top-1 probability", "margin": "margin"}


def _valid_place(text: str) -> bool:
    if text in ("cpu", "cuda", "mps"):
        return True
    if text.startswith("cuda:") and text[5:].isdigit():
        return True
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _head_span(block, keyword: str):
    s = block.span
    return ir.Span(s.file, s.line, s.col, s.line, s.col + len(keyword))
