"""What every pass of the checker shares: `CheckState`, the symbol table (`Symbol`), the
`Checked` program being built, and the lookups the passes make through them.

`check/__init__.py` makes one `CheckState` and hands it to each pass in turn (the
functions of `declarations.py`, `routers.py`, `route.py`, `serve.py`). Its fields are
the state they share: the declared names, the names already used or reported undefined
(one report per name, no cascades), the parameters' bindings and substitution
(`params.py`), the diagnostics, and `out`. Its methods are the lookups that report what
they cannot resolve: `err`, `is_first`, `attrs`, `choice`, `lookup`, `value_ok`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.compiler.builtins import BUILTIN_MODELS, LANGUAGE_VERSION
from tokenrouter.compiler.check import params as check_params
from tokenrouter.dsl import ast
from tokenrouter.dsl.diagnostics import Diagnostic, Note, did_you_mean, words

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
    engine: str = engines.DEFAULT  # model: its serving engine, and over how many ranks
    tensor_parallel: int = 1


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


def bound_model_path(text: str) -> str:
    """A `--model` binding: a built-in name as it is, a path made absolute against the
    working directory."""
    if text in BUILTIN_MODELS and not os.path.exists(text):
        return text
    return os.path.abspath(os.path.expanduser(text))


def as_int(node, minimum: int) -> int | None:
    """A whole-number literal >= `minimum`, or None."""
    if isinstance(node, ast.Num) and node.is_int and node.value >= minimum:
        return int(node.value)
    return None


def as_word(node) -> str | None:
    """The word a value position holds (`auto`, `relu`, `true`), or None."""
    return node.name.text if isinstance(node, ast.Ref) else None


def head_span(block, keyword: str):
    """The span of a block's keyword (`route`, `serve`), for diagnostics about the block."""
    s = block.span
    return ir.Span(s.file, s.line, s.col, s.line, s.col + len(keyword))


class CheckState:
    """The state the checker's passes share, and the lookups they make through it."""

    def __init__(self, file: ast.File, base_dir: str, params: dict[str, str] | None = None,
                 model_paths: dict[str, str] | None = None):
        self.file, self.base_dir = file, base_dir
        self.given_params = params or {}  # `--set` values: NAME -> text
        self.model_paths = model_paths or {}  # `--model` bindings: NAME -> path or built-in name
        self.bound: dict[str, check_params.Bound] = {}  # parameters, once bound
        self.subst = check_params.Substitution({})  # replaces their uses by their values
        self.diags: list[Diagnostic] = []
        self.symbols: dict[str, Symbol] = {}  # the first declaration of each name
        self.used: set[str] = set()
        self.reported_undefined: set[str] = set()
        self.out = Checked(file.path, base_dir, LANGUAGE_VERSION)

    def err(self, code, message, span, hint=None, notes=()):
        note = self.subst.note(span) if span is not None else None
        notes = tuple(notes) + ((note,) if note else ())
        self.diags.append(Diagnostic(code, message, span, hint, notes))

    def is_first(self, item) -> bool:
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
        word = as_word(attr.value)
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
