"""Where a model's files are: a checkpoint folder, a built-in name (built into the cache on
first use) or a GGUF file.

A GGUF file (given by path, or behind a built-in name) has two cache entries
(`registry.gguf_entry`): one with what is not weights (config.json, the tokenizer, the
file's identity: a few hundred KiB), which `resolve_folder` gives and every command that only
needs the model's facts reads (the compiler's tokenizer check, context lengths, fingerprints),
and a float checkpoint, which only `quant = none` and float consumers (vLLM, transformers,
GGUF export) ask for (`checkpoint_folder`). The quantised formats read the weights from the
file itself (`gguf_source`), so they never make a float copy.
"""

from __future__ import annotations

import os

from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.errors import LoadError, MissingFile
from tokenrouter.runtime.loader.builtin.registry import BUILTIN_MODELS, gguf_entry

GGUF_KINDS = ("gguf", "gguf-meta")  # the cache keys of a GGUF's entries


def resolve_folder(path_or_name: str) -> tuple[str, str]:
    """(name, folder with config.json and the tokenizer) for a built-in name, a GGUF file (its
    entry without weights) or a folder."""
    if path_or_name in BUILTIN_MODELS:
        return path_or_name, BUILTIN_MODELS[path_or_name].folder()
    path = _file(path_or_name)
    if path is not None:
        return os.path.splitext(os.path.basename(path))[0], cache.get_or_build(*gguf_entry(path))
    return os.path.basename(os.path.normpath(os.path.expanduser(path_or_name))), os.path.expanduser(path_or_name)


def checkpoint_folder(path_or_name: str) -> tuple[str, str]:
    """(name, checkpoint folder with float weights): a GGUF file (or a built-in model that is
    one) dequantised into the cache on first use; a folder or another built-in as it is."""
    source = gguf_source(path_or_name)
    if source is None:
        return resolve_folder(path_or_name)
    name = path_or_name if path_or_name in BUILTIN_MODELS else os.path.splitext(os.path.basename(source))[0]
    return name, cache.get_or_build(*gguf_entry(source, weights=True))


def gguf_source(path_or_name: str) -> str | None:
    """The GGUF file a model is (a .gguf path, or a built-in model made from one), else None."""
    if path_or_name in BUILTIN_MODELS:
        _, key, _ = BUILTIN_MODELS[path_or_name].entry()
        return key["path"] if key.get("kind") in GGUF_KINDS else None
    return _file(path_or_name)


def native_gguf(path_or_name: str) -> str:
    """The GGUF file whose blocks `quant=native` runs: the file itself or a built-in model's source."""
    source = gguf_source(path_or_name)
    if source is not None:
        return source
    if path_or_name in BUILTIN_MODELS:
        raise LoadError(f"quant=native runs a GGUF file's own blocks, but {path_or_name!r} is a float "
                        "checkpoint; use quant=int4 or quant=int8 to quantise it on load")
    raise LoadError(f"quant=native runs a GGUF file's own blocks, but {path_or_name!r} is not a .gguf "
                    "file; use quant=int4 or quant=int8 to quantise it on load")


def _file(path_or_name: str) -> str | None:
    """The .gguf file `path_or_name` names; None for a folder; errors for anything else."""
    path = os.path.expanduser(path_or_name)
    if os.path.isdir(path):
        return None
    if os.path.isfile(path):
        if not path.lower().endswith(".gguf"):
            raise LoadError(f"{path}: expected a checkpoint folder or a .gguf file")
        return path
    if os.path.exists(path):
        raise LoadError(f"{path}: is not a regular file (a device, a pipe or a socket): expected a checkpoint "
                        f"folder or a .gguf file")
    raise MissingFile(f"no such model: {path_or_name!r} is neither a file, a folder nor a built-in "
                      f"name ({', '.join(BUILTIN_MODELS)})")
