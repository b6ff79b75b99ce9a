"""What lowering needs to know about the models, from the layer that can read them.

The compiler never loads a model. Lowering asks a function the caller passes
(`ModelFactsFn`, built on the runtime's loader: `tokenrouter.runtime.loader.model_facts`)
for each model's checkpoint folder, and reads only cheap things from it itself: the hidden
size and layer count in `config.json`, the safetensors headers a fingerprint hashes.

`facts(path, full)` answers for a model path (a checkpoint folder, a .gguf file or a
built-in name):
- `full=False` (`tokenrouter check`): the folder if one exists without building anything
  (a folder, a built-in model already in the cache), else None; no tokenizer is read.
- `full=True` (`load_program`): the folder, made now if need be (the loader converts a GGUF
  file or builds a built-in model into its cache), and the fingerprint of its tokenizer.
  A model that cannot be had raises an exception whose text is meant for the user.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ModelFacts:
    folder: str  # the checkpoint folder: config.json, tokenizer.json, *.safetensors
    tokenizer: str | None = None  # the vocabulary's fingerprint (full only; None without tokenizer.json)
    tokenizer_error: str | None = None  # why the tokenizer could not be read, if it could not


ModelFactsFn = Callable[[str, bool], "ModelFacts | None"]


def folders_only(path: str, full: bool) -> ModelFacts | None:
    """The facts `check_file` uses when it is given none: a checkpoint folder is itself,
    nothing else is known (no built-in names, no GGUF files, no tokenizers)."""
    return ModelFacts(path) if os.path.isdir(path) else None
