"""Where a model's checkpoint folder is: a folder, a built-in name (built into the cache on
first use) or a GGUF file (converted into the cache); and which GGUF file a native load reads."""

from __future__ import annotations

import os

from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.errors import LoadError, MissingFile
from tokenrouter.runtime.loader.builtin.registry import BUILTIN_MODELS, gguf_entry


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
        return os.path.splitext(os.path.basename(path))[0], cache.get_or_build(*gguf_entry(path))
    if os.path.exists(path):
        raise LoadError(f"{path}: is not a regular file (a device, a pipe or a socket): expected a checkpoint "
                        f"folder or a .gguf file")
    raise MissingFile(f"no such model: {path_or_name!r} is neither a file, a folder nor a built-in "
                      f"name ({', '.join(BUILTIN_MODELS)})")


def native_gguf(path_or_name: str) -> str:
    """The GGUF file whose blocks `quant=native` runs: the file itself or a built-in model's source."""
    if path_or_name in BUILTIN_MODELS:
        _, key, _ = BUILTIN_MODELS[path_or_name].entry()
        if key.get("kind") == "gguf":
            return key["path"]
        raise LoadError(f"quant=native runs a GGUF file's own blocks, but {path_or_name!r} is a float "
                        "checkpoint; use quant=int4 or quant=int8 to quantise it on load")
    path = os.path.expanduser(path_or_name)
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        return path
    if os.path.exists(path):
        raise LoadError(f"quant=native runs a GGUF file's own blocks, but {path_or_name!r} is not a .gguf "
                        "file; use quant=int4 or quant=int8 to quantise it on load")
    resolve_folder(path_or_name)  # raises the usual MissingFile
    raise MissingFile(path_or_name)
