"""Loading models: Hugging Face checkpoint folders, GGUF files and built-in names.

    from tokenrouter.runtime.loader import load_model, Tokenizer, BUILTIN_MODELS, LoadError
    m = load_model("smollm2-135m")          # or a folder, or a .gguf file; dtype=torch.float32
    m.name, m.config (ModelConfig), m.weights (dict[str, Tensor], Hugging Face names), m.tokenizer
    tok = m.tokenizer
    tok.encode(text) -> list[int]; tok.decode(ids) -> str
    tok.apply_chat_template(messages, add_generation_prompt=True) -> str   (Jinja2)
    tok.eos_token_ids -> tuple[int, ...]; tok.vocab_size; tok.fingerprint -> str

`m.weights` holds exactly the tensors the engine reads, shape-checked against the config; with
tied embeddings there is no `lm_head.weight` (use `model.embed_tokens.weight`). GGUF files and
built-in models are converted once and cached as checkpoint folders under `$TOKENROUTER_CACHE`
(default `~/.cache/tokenrouter`); later loads read safetensors only. Every failure is a
`LoadError` with a message meant for the user.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .errors import (LoadError, MissingFile, ShapeMismatch, UnsupportedArchitecture,
                     UnsupportedQuantization)
from .registry import BUILTIN_MODELS, BuiltinModel
from .tokenizer import Tokenizer

__all__ = ["load_model", "resolve_folder", "LoadedModel", "Tokenizer", "BUILTIN_MODELS", "BuiltinModel",
           "LoadError", "MissingFile", "ShapeMismatch", "UnsupportedArchitecture", "UnsupportedQuantization"]


@dataclass
class LoadedModel:
    name: str
    config: Any  # ModelConfig
    weights: dict[str, Any]
    tokenizer: Tokenizer
    folder: str  # the checkpoint folder the weights were read from (a cache entry for GGUF/built-ins)
    raw_config: dict[str, Any] = field(default_factory=dict)

    def num_parameters(self) -> int:
        return sum(w.numel() for w in self.weights.values())


def resolve_folder(path_or_name: str) -> tuple[str, str]:
    """(name, checkpoint folder) for a built-in name, a GGUF file (converted and cached) or a folder."""
    if path_or_name in BUILTIN_MODELS:
        return path_or_name, BUILTIN_MODELS[path_or_name].folder()
    path = os.path.expanduser(path_or_name)
    if os.path.isdir(path):
        return os.path.basename(os.path.normpath(path)), path
    if os.path.isfile(path):
        if not path.lower().endswith(".gguf"):
            raise LoadError(f"{path}: expected a checkpoint folder or a .gguf file")
        from . import cache
        from .registry import gguf_entry
        return os.path.splitext(os.path.basename(path))[0], cache.get_or_build(*gguf_entry(path))
    raise MissingFile(f"no such model: {path_or_name!r} is neither a file, a folder nor a built-in "
                      f"name ({', '.join(BUILTIN_MODELS)})")


def load_model(path_or_name: str, dtype=None) -> LoadedModel:
    """Load a model; see the module docstring."""
    import torch

    from .hf import read_folder
    name, folder = resolve_folder(path_or_name)
    config, weights, tokenizer, raw = read_folder(folder, dtype or torch.float32)
    return LoadedModel(name=name, config=config, weights=weights, tokenizer=tokenizer,
                       folder=folder, raw_config=raw)
