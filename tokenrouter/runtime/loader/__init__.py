"""Loading models: Hugging Face checkpoint folders, GGUF files and built-in names.

    from tokenrouter.runtime.loader import load_model, Tokenizer, BUILTIN_MODELS, LoadError
    m = load_model("smollm2-135m")          # or a folder, or a .gguf file; dtype=torch.float32
    m = load_model("smollm2-135m", quant="native")   # a GGUF's own blocks
    Engine(m.config, m.weights, m.engine_options(max_model_len=256))  # its format and cached kernel plan
    m.name, m.config (ModelConfig), m.weights (dict[str, Tensor], Hugging Face names), m.tokenizer
    tok = m.tokenizer
    tok.encode(text) -> list[int]; tok.decode(ids) -> str
    tok.apply_chat_template(messages, add_generation_prompt=True) -> str   (Jinja2)
    tok.eos_token_ids -> tuple[int, ...]; tok.vocab_size; tok.fingerprint -> str
    program_tokenizer(program)              # a routing program's tokenizer, no weights loaded

`m.weights` holds exactly the tensors the engine reads, shape-checked against the config; with
tied embeddings there is no `lm_head.weight` (use `model.embed_tokens.weight`). A GGUF file
(or a built-in model made from one) loaded in a quantised format (`quant="native" | "int4" |
"int8"`) gives its quantised matrices as the file's own blocks (`kernels.blocks.BlockRows`,
mapped from the file), which the engine decodes for its kernels, requantises (int4, int8) or
reads rows of in place (the embedding, the head's rescoring): the cache holds only the
file's config and tokenizer (`resolve.py`). With `quant="none"` it is converted once into a
float checkpoint folder under `$TOKENROUTER_CACHE` (default `~/.cache/tokenrouter`), as
built-in models are; later loads read safetensors only; a float checkpoint in int4 or int8
loads floats, which the engine quantises. Every failure is a `LoadError` with a message meant
for the user.

`tokenrouter check` imports this package for `model_facts`, so the package, `registry.py` and
`tokenizer.py` import the weight readers (torch, gguf, the kernels and the engine: `hf.py`,
`gguf_loader.py`, `derive.py`, `bench_pair.py`, `kernels.quant`, `kernels.plan`,
`engine.options`) and the chat-template renderer inside the functions that use them, not at
the top: measured after the compiler on a 2-core host, importing the package takes 0.03 s
this way and 0.26-0.35 s with those imports at the top (the chat-template renderer alone
adds 0.06 s).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.compiler.builtins import default_quant
from tokenrouter.runtime.cache import file_key
from tokenrouter.runtime.loader.errors import (LoadError, MissingFile, ShapeMismatch, UnsupportedArchitecture,
                     UnsupportedQuantization)
from tokenrouter.runtime.loader.facts import model_facts
from tokenrouter.runtime.loader.builtin.registry import BUILTIN_MODELS, BuiltinModel
from tokenrouter.runtime.loader.resolve import checkpoint_folder, gguf_source, native_gguf, resolve_folder
from tokenrouter.runtime.loader.tokenizer import Tokenizer

__all__ = ["load_model", "quant_options", "cached_kernel_plan", "resolve_folder", "checkpoint_folder", "model_facts", "LoadedModel", "Tokenizer", "BUILTIN_MODELS",
           "BuiltinModel", "LoadError", "MissingFile", "ShapeMismatch", "UnsupportedArchitecture",
           "UnsupportedQuantization", "program_tokenizer"]


@dataclass
class LoadedModel:
    name: str
    config: Any  # ModelConfig
    weights: dict[str, Any]
    tokenizer: Tokenizer
    folder: str  # the checkpoint folder the weights were read from (a cache entry for GGUF/built-ins)
    raw_config: dict[str, Any] = field(default_factory=dict)
    quant: str = "none"
    source: str = ""  # the GGUF file of a native load

    def model_id(self) -> str:
        """What identifies these weights for a cached kernel plan."""
        return _model_id(self.source, self.folder)

    def engine_options(self, quant: str | None = None, threads: int | None = None, **options: Any):
        """The `EngineOptions` that hold this model in its format (`quant`, else the one it was
        loaded for) with its measured kernel plan cached (for `threads`, else torch's), and
        the other `options` given."""
        quant = quant or self.quant
        import torch

        from tokenrouter.runtime.engine.options import EngineOptions
        from tokenrouter.runtime.kernels.plan import plan_path
        act = torch.float32 if quant == "none" else torch.bfloat16
        return EngineOptions(quant=quant, plan_cache=plan_path(self.model_id(), quant, act, threads), **options)


def load_model(path_or_name: str, dtype=None, quant: str | None = None) -> LoadedModel:
    """Load a model; see the module docstring. `quant=None`: the model's default format
    (`compiler.builtins.default_quant`: native for a built-in GGUF that is quantised, else none)."""
    import torch

    from tokenrouter.runtime.kernels.quant import QUANTS
    from tokenrouter.runtime.loader.hf import check_weights, parse_config, read_folder
    quant = quant or default_quant(path_or_name)
    if quant not in QUANTS:
        raise LoadError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    source = native_gguf(path_or_name) if quant == "native" else gguf_source(path_or_name)
    if quant != "none" and source is not None:  # a GGUF's own blocks, read in place
        from tokenrouter.runtime.loader.gguf_loader import read_gguf
        path = source
        raw, weights, tokenizer = read_gguf(path, native=True)
        config = parse_config(raw, path)
        weights = check_weights(config, weights, path)
        weights = {n: (w if not isinstance(w, torch.Tensor) else w.to(dtype or torch.float32))
                   for n, w in weights.items()}
        name = path_or_name if path_or_name in BUILTIN_MODELS else os.path.splitext(os.path.basename(path))[0]
        return LoadedModel(name=name, config=config, weights=weights, tokenizer=tokenizer, folder=os.path.dirname(path),
                           raw_config=raw, quant=quant, source=os.path.realpath(path))
    name, folder = checkpoint_folder(path_or_name)
    config, weights, tokenizer, raw = read_folder(folder, dtype or torch.float32)
    return LoadedModel(name=name, config=config, weights=weights, tokenizer=tokenizer,
                       folder=folder, raw_config=raw, quant=quant)


def quant_options(model: Any, quant: str, **options: Any):
    """The `EngineOptions` that hold `model` (a `LoadedModel`, or any object with config and
    weights) in format `quant`, with its kernel plan cached when the model has a known source,
    and the other `options` given."""
    if isinstance(model, LoadedModel):
        return model.engine_options(quant, **options)
    from tokenrouter.runtime.engine.options import EngineOptions
    return EngineOptions(quant=quant, **options)


def _model_id(source: str, folder: str) -> str:
    return json.dumps(file_key(source) if source else {"folder": os.path.realpath(folder)}, sort_keys=True)


def cached_kernel_plan(path: str, quant: str, threads: int) -> tuple[str | None, dict | None]:
    """(where the kernel plan of model `path` in format `quant` at `threads` threads is cached
    on this host, the cached file's contents or None when it is not measured yet), without
    loading or converting anything: (None, None) when the model is not in the cache yet."""
    import torch

    from tokenrouter.runtime import cache
    from tokenrouter.runtime.kernels.plan import plan_path
    try:
        gguf = native_gguf(path) if quant == "native" else gguf_source(path)
    except LoadError:
        return None, None
    if gguf is not None and quant != "none":  # read from the file itself
        source, folder = os.path.realpath(gguf), ""
    elif gguf is not None:
        from tokenrouter.runtime.loader.builtin.registry import gguf_entry
        slug, key, _ = gguf_entry(gguf, weights=True)
        source, folder = "", cache.entry_path(slug, key) if cache.is_cached(slug, key) else ""
    elif os.path.isdir(os.path.expanduser(path)):
        source, folder = "", os.path.expanduser(path)
    elif path in BUILTIN_MODELS:
        entry = BUILTIN_MODELS[path]
        source, folder = "", entry.folder() if entry.is_cached() else ""
    else:
        return None, None
    if not source and not folder:
        return None, None
    act = torch.float32 if quant == "none" else torch.bfloat16
    where = plan_path(_model_id(source, folder), quant, act, threads)
    try:
        with open(where, encoding="utf-8") as f:
            return where, json.load(f)
    except (OSError, ValueError):
        return where, None


def program_tokenizer(program: Any) -> Tokenizer:
    """The tokenizer of a routing program (an `ir.Program`): its start writer's model's (an
    ensemble's first member), with the end-of-sequence ids of that model's config.json and
    generation_config.json, read without loading any weights. The routed models share it
    (the compiler checks their fingerprints)."""
    ens = {e.name: e for e in program.ensembles}
    name = ens[program.start].members[0] if program.start in ens else program.start
    _, folder = resolve_folder(program.model(name).path)
    eos: list[int] = []
    for fn in ("config.json", "generation_config.json"):
        p = os.path.join(folder, fn)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                e = json.load(f).get("eos_token_id")
            eos += e if isinstance(e, list) else ([] if e is None else [e])
    return Tokenizer.from_dir(folder, eos_token_ids=eos)
