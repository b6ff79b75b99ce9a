"""Assemble a checked program into an `ir.Program`.

The checker already speaks IR; what is left needs the models themselves: the widths of
router inputs that are hidden states or token embeddings (the model's hidden size), the
range of `hidden(LAYER)` (its layer count), and the check that routed models share a
tokenizer. Where a model's files are, and its tokenizer's fingerprint, come from the
caller's `ModelFactsFn` (`model_facts.py`); this module reads only a checkpoint folder's
config.json. With `full` (`load_program`) models are resolved fully (the caller's function
may build a built-in model's cache on first use); without (`check_file`) only what exists
is read, and other widths stay 0, since `tokenrouter check` must stay fast and never load
weights.
"""

from __future__ import annotations

import dataclasses
import json
import os

from tokenrouter.compiler import ir
from tokenrouter.compiler.check import Checked
from tokenrouter.compiler.features import Int, feature_of
from tokenrouter.compiler.model_facts import ModelFacts, ModelFactsFn, folders_only
from tokenrouter.compiler.text import input_text
from tokenrouter.compiler.weights.check import weight_diagnostics
from tokenrouter.dsl.diagnostics import Diagnostic, Note


@dataclasses.dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int


def _read_config(folder: str) -> ModelShape | None:
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        return ModelShape(int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lower(checked: Checked, full: bool = False, check_weights: bool = True,
          model_facts: ModelFactsFn = folders_only) -> tuple[ir.Program | None, list[Diagnostic]]:
    """(Program, diagnostics); the program is None when a model cannot be read (full mode).
    `check_weights=False` skips reading router/head files (`fit` is about to replace them).
    `model_facts` tells where each model's files are (`model_facts.py`)."""
    diags: list[Diagnostic] = []
    models = list(checked.models)
    by_name = {m.name: m for m in models}
    known = _Models(model_facts, full, diags)
    routers = [_with_widths(r, by_name[r.model], known, full, diags) for r in checked.routers]
    if check_weights:
        diags.extend(weight_diagnostics(routers, checked.transitions, models, known.known_folder, known.hidden_size))
    if full:
        _check_tokenizers(models, known.facts, diags)
    if any(d.is_error for d in diags):
        return None, diags
    program = ir.Program(
        source=checked.path, language_version=checked.language_version, models=tuple(models),
        start=checked.start, transitions=tuple(checked.transitions), bounds=tuple(checked.bounds),
        ensembles=tuple(checked.ensembles), routers=tuple(routers), schedule=checked.schedule,
        params=tuple(checked.params))
    return program, diags


class _Models:
    """What lowering knows of the models: each asked once of the caller's `model_facts`
    (a model that cannot be had is an E308 in `diags`)."""

    def __init__(self, model_facts: ModelFactsFn, full: bool, diags: list[Diagnostic]):
        self.model_facts, self.full, self.diags = model_facts, full, diags
        self.known: dict[str, ModelFacts | None] = {}

    def facts(self, model: ir.Model) -> ModelFacts | None:
        """Full mode: the model resolved (built if need be); otherwise only a folder path."""
        if model.name not in self.known:
            try:
                if self.full:
                    self.known[model.name] = self.model_facts(model.path, True)
                else:
                    self.known[model.name] = ModelFacts(model.path) if os.path.isdir(model.path) else None
            except Exception as exc:  # the loader's errors are meant for users: pass them on
                self.known[model.name] = None
                self.diags.append(Diagnostic("E308", f"cannot load model '{model.name}' ({model.path}): {exc}",
                                             model.span))
        return self.known[model.name]

    def folder(self, model: ir.Model) -> str | None:
        f = self.facts(model)
        return f.folder if f else None

    def known_folder(self, model: ir.Model) -> str | None:
        """The folder as far as it is known, or exists without building anything."""
        if self.full or os.path.isdir(model.path):
            folder = self.folder(model)
            if folder:
                return folder
        cached = self.model_facts(model.path, False)
        return cached.folder if cached else None

    def hidden_size(self, model: ir.Model) -> int | None:
        folder = self.known_folder(model)
        shape = _read_config(folder) if folder else None
        return shape.hidden_size if shape else None


def _with_widths(router: ir.RouterNet, model: ir.Model, known: _Models, full: bool,
                 diags: list[Diagnostic]) -> ir.RouterNet:
    """The router with the widths of its hidden-state and embedding inputs (the model's
    hidden size, where its config is known), and an E306 for a layer the model lacks."""
    shape = None
    if any(_layer_args(i) or _model_width(i) for i in router.inputs):
        folder = known.folder(model)
        shape = _read_config(folder) if folder else None
        if shape is None and full and folder:
            diags.append(Diagnostic("E308", f"cannot read the hidden size of model '{router.model}' from "
                                    f"{folder}/config.json", router.span))
    inputs = []
    for inp in router.inputs:
        if shape is not None:
            for arg in _layer_args(inp):
                if getattr(inp, arg.field) > shape.num_layers:
                    diags.append(Diagnostic(
                        "E306", f"router '{router.name}' reads {input_text(inp)}, but model '{router.model}' "
                        f"has {shape.num_layers} layers", router.span,
                        hint=f"layers run from 0 (the embeddings) to {shape.num_layers}; -1 is after the final norm"))
            if _model_width(inp):
                inp = dataclasses.replace(inp, **{feature_of(inp).value.width: shape.hidden_size})
        inputs.append(inp)
    return dataclasses.replace(router, inputs=tuple(inputs))


def _model_width(inp: ir.RouterInput) -> bool:
    """A vector input whose width is the model's hidden size (`features.Vector`)."""
    decl = feature_of(inp)
    return decl is not None and not decl.scalar and decl.value.model_width


def _layer_args(inp: ir.RouterInput) -> list[Int]:
    """An input's arguments that number a decoder layer of the model."""
    decl = feature_of(inp)
    return [a for a in decl.args if isinstance(a, Int) and a.layer] if decl is not None else []


def _check_tokenizers(models, facts_of, diags):
    """Routed models must share a tokenizer: compare vocabulary fingerprints of the models
    whose folders have a tokenizer.json."""
    prints = []
    for model in models:
        facts = facts_of(model)
        if facts is None:
            continue
        if facts.tokenizer_error is not None:
            diags.append(Diagnostic("E308", f"cannot read the tokenizer of model '{model.name}': "
                                    f"{facts.tokenizer_error}", model.span))
        elif facts.tokenizer is not None:
            prints.append((model, facts.tokenizer))
    for model, fp in prints[1:]:
        first, first_fp = prints[0]
        if fp != first_fp:
            diags.append(Diagnostic(
                "E309", f"models '{first.name}' and '{model.name}' do not share a tokenizer", model.span,
                hint="token-level routing hands token ids between models, so their vocabularies must be identical",
                notes=(Note(f"'{first.name}' declared here", first.span),)))
