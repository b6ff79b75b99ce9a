"""The model facts the compiler's lowering asks for (`compiler/model_facts.py`), from the loader.

    program = load_program(path, model_facts=model_facts)

Without `full` only what exists is named (a folder, a built-in model already cached); with
it the model is resolved as `load_model` would resolve it (a GGUF file converted, a
built-in model built, both into the cache) and its tokenizer's fingerprint is read.
"""

from __future__ import annotations

import os

from tokenrouter.compiler.model_facts import ModelFacts

from tokenrouter.runtime.loader.builtin.registry import BUILTIN_MODELS
from tokenrouter.runtime.loader.errors import MissingFile
from tokenrouter.runtime.loader.resolve import resolve_folder
from tokenrouter.runtime.loader.tokenizer import Tokenizer


def model_facts(path: str, full: bool) -> ModelFacts | None:
    if os.path.isdir(path):
        folder = path
    elif not full:
        entry = BUILTIN_MODELS.get(path)
        return ModelFacts(entry.folder()) if entry is not None and entry.is_cached() else None
    else:
        folder = resolve_folder(path)[1]
    if not full:
        return ModelFacts(folder)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise MissingFile(f"{folder}: not a checkpoint folder (it has no config.json)")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return ModelFacts(folder)
    try:
        return ModelFacts(folder, tokenizer=Tokenizer.from_dir(folder).fingerprint)
    except Exception as exc:  # reported as a diagnostic of the model's declaration
        return ModelFacts(folder, tokenizer_error=str(exc))
