"""Tool calling, the request's side: the tools a chat request offers and how it wants them
used (`ToolUse`), their form for the chat template, an assistant's calls in the history,
and the grammar that forces a call.

- `tools` reach the chat template as Hugging Face templates expect them (the template's
  `tools` variable), and an assistant message's `tool_calls` with their arguments as an
  object (OpenAI sends them as JSON text; templates write them with `tojson`), so the
  model's own template renders the offer, the calls and the `tool` messages' results.
- `tool_choice`: `none` reads no call from the output; `auto` (the default with tools)
  reads the calls the model chose to write; `required` and a named function force a call
  with a grammar in the parser's format (`ToolParser.grammar`) on the structured-output path
  (llguidance, every writer), so even a model never trained for tools writes one.
- `parallel_tool_calls: false`: a forced reply holds one call; in an `auto` reply the
  calls after the first come back as text.
The calls are read from the output by `tool_output.ToolText`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from tokenrouter.protocol.sampling import Structured
from tokenrouter.runtime.http.schema import BadRequest, ChatRequest, Tool, ToolCallMessage
from tokenrouter.runtime.http.tool_parsers import ToolParser

__all__ = ["ToolUse", "forced_calls", "template_calls", "template_tools", "tool_use"]


@dataclass(frozen=True)
class ToolUse:
    """The tools a request lets the reply call, read from its output by `parser`."""

    parser: ToolParser
    names: frozenset[str]
    choice: str  # "auto", "required" or "function"
    function: str | None = None  # the function a named `tool_choice` names
    parallel: bool = True


def tool_use(req: ChatRequest, parser: ToolParser) -> ToolUse | None:
    """How `req` uses its tools (None: calls are not read); a choice that cannot hold is a 400."""
    tools = req.tools or []
    names = [t.function.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadRequest(f"tools: two functions are named {twice[0]!r}", "tools")
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice == "none":
        return None
    if not tools:
        if choice == "auto":
            return None
        raise BadRequest("tool_choice other than none or auto needs tools", "tool_choice")
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, str):
        return ToolUse(parser, frozenset(names), choice, parallel=parallel)
    if choice.function.name not in names:
        raise BadRequest(f"tool_choice names function {choice.function.name!r}, which is not one of the tools "
                         f"({', '.join(names)})", "tool_choice")
    return ToolUse(parser, frozenset(names), "function", choice.function.name, parallel)


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template's `tools` variable."""
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]


def forced_calls(use: ToolUse | None, tools: list[Tool] | None,
                 token_id: Callable[[str], int | None]) -> Structured | None:
    """The grammar of a reply that must call (`required`, or the named function), else None."""
    if use is None or use.choice == "auto":
        return None
    functions = [(t.function.name, {"type": "object", **(t.function.parameters or {})}) for t in tools or []
                 if use.function is None or t.function.name == use.function]  # arguments: an object
    return Structured(kind="lark", spec=use.parser.grammar(functions, use.parallel and use.function is None,
                                                           token_id))


def template_calls(calls: list[ToolCallMessage], where: str) -> list[dict[str, Any]]:
    """An assistant message's calls as chat templates read them: arguments as an object."""
    out = []
    for j, call in enumerate(calls):
        args = call.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise BadRequest(f"{where}.tool_calls[{j}].function.arguments is not JSON", where) from None
            if not isinstance(args, dict):
                raise BadRequest(f"{where}.tool_calls[{j}].function.arguments is not a JSON object", where)
        out.append({**call.model_dump(exclude_none=True), "function": {"name": call.function.name,
                                                                     "arguments": args}})
    return out
