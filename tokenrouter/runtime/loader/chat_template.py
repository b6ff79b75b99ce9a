"""Rendering a model's chat template with Jinja2, in the same sandbox and with the same helpers
(`raise_exception`, `tojson`, `strftime_now`) that Hugging Face templates are written against."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenrouter.runtime.loader.errors import LoadError


class _TemplateRaised(Exception):
    pass


def _raise(message: str):
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise LoadError(f"the model's chat template does not parse: {exc}") from None


def render(source: str, messages: list[dict[str, Any]], **context: Any) -> str:
    """The prompt text for `messages` (a list of {"role", "content"} dicts)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise LoadError("chat messages must be a list of {'role': ..., 'content': ...} objects")
    try:
        return _compile(source).render(messages=messages, **context)
    except _TemplateRaised as exc:
        raise LoadError(f"the chat template rejected the messages: {exc}") from None
    except TemplateError as exc:
        raise LoadError(f"the chat template failed: {exc}") from None
