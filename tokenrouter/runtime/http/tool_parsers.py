"""Tool-call parsers: how a model family writes a tool call in its output, read back into
OpenAI's `tool_calls` (the registry vLLM has as `--tool-call-parser`).

A parser names the markers around one call (`start`, `end`), reads the text between them
(`call`), and writes the Lark grammar that forces calls in its own format (`grammar`: for
`tool_choice` `required` or a named function, on llguidance's `%json` for each call's
object, so the model writes what the parser reads, on any model). `fits` says whether a
chat template writes calls this way. The server's parser is the one `tokenrouter serve
--tool-call-parser NAME` names, else the first in `PARSERS` whose `fits` accepts the model's
chat template, else `DEFAULT` (`choose`). The output is split into text and calls by
`tool_output.ToolText`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

__all__ = ["DEFAULT", "PARSERS", "Hermes", "ToolCall", "ToolParser", "choose"]

#: how a forced call's JSON is written: compact, as the chat templates write calls
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCall:
    """One call read from the output: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolParser:
    """A model family's tool-call format. Subclasses set the markers and read a call."""

    name: ClassVar[str]
    start: ClassVar[str]  # the text that opens a call
    end: ClassVar[str]  # the text that closes it (a call left open at the end is read to the end)
    families: ClassVar[str]  # the models that write this format, for the docs and the flag's help
    # the family also writes a call as its bare JSON object, without the markers: read as a
    # call where the reply opens with one (or one follows a call), fenced as ```json or not
    bare: ClassVar[bool] = False

    def call(self, body: str, names: frozenset[str]) -> ToolCall | None:
        """The call written between the markers, or None when it is malformed (not JSON, no
        name of the request's tools, arguments not an object)."""
        raise NotImplementedError

    def fits(self, template: str) -> bool:
        """Whether a chat template writes calls in this format."""
        raise NotImplementedError

    def grammar(self, functions: Sequence[tuple[str, dict[str, Any]]], parallel: bool,
                token_id: Callable[[str], int | None]) -> str:
        """A Lark grammar (llguidance's dialect) whose sentences are one call, or one or more
        when `parallel`, of the given (name, parameters schema) functions, in this format.
        `token_id` gives the id of a marker that is one token of the vocabulary (an added
        token such as Qwen's `<tool_call>`, which llguidance matches by id only)."""
        raise NotImplementedError


def literal(text: str, token_id: Callable[[str], int | None]) -> str:
    """A marker in Lark: its token by id when the vocabulary has it as one token, else its text."""
    tid = token_id(text)
    return f"<[{tid}]>" if tid is not None else json.dumps(text)


class Hermes(ToolParser):
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call:
    Hermes 2 Pro and 3, Qwen2 and Qwen2.5 (the Coder models included), Qwen3. Qwen2.5-Coder
    0.5B and 1.5B, greedy, write the JSON object alone though their template shows the
    markers, so a bare object that opens the reply is read too (`bare`), as llama.cpp's
    Hermes parser reads it."""

    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"
    families = "Hermes 2 Pro / 3, Qwen2, Qwen2.5 (Coder included), Qwen3"
    bare = True

    def call(self, body: str, names: frozenset[str]) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))

    def fits(self, template: str) -> bool:
        return self.start in template

    def grammar(self, functions: Sequence[tuple[str, dict[str, Any]]], parallel: bool,
                token_id: Callable[[str], int | None]) -> str:
        calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
                  "required": ["name", "arguments"], "additionalProperties": False} for n, p in functions]
        schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": JSON_STYLE}
        block = f'{literal(self.start, token_id)} "\\n" call "\\n" {literal(self.end, token_id)}'
        start = f'start: {block} ("\\n" {block})*' if parallel else f"start: {block}"
        return f"{start}\ncall: %json {json.dumps(schema)}\n"


#: the parsers, by the name `--tool-call-parser` takes, in the order `choose` tries them
PARSERS: dict[str, type[ToolParser]] = {Hermes.name: Hermes}
#: the parser of a model whose chat template names no format: a grammar still forces its calls
DEFAULT = Hermes.name


def choose(template: str | None, name: str | None = None) -> ToolParser:
    """The parser `name` names, else the first whose format the chat template writes, else
    `DEFAULT`. An unknown name is a ValueError listing the known ones."""
    if name is not None:
        if name not in PARSERS:
            raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(PARSERS)}")
        return PARSERS[name]()
    for cls in PARSERS.values():
        if template and cls().fits(template):
            return cls()
    return PARSERS[DEFAULT]()
