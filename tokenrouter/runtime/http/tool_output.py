"""Tool calling, the output's side: a reply's text split into its text and its calls, and
their OpenAI forms (a message, stream deltas, the finish reason).

`ToolText` reads the frontend's text, the text every writer wrote merged in order, so a
call that spans a handoff is one call. It takes the text in pieces as a stream brings it and
gives back what can be sent: text that cannot be part of a call, and each call as soon as
its closing marker arrives. Text that might open a call (a tail that is a prefix of the
parser's start marker) and whitespace are held back until it is clear; the whitespace next
to a call (the newlines templates put around one) is dropped. A call the parser cannot read
(not JSON, a function the request did not offer, arguments that are not an object) comes
back as the text it was, markers and whitespace included, never as an error; so does every
call after the first when the request said `parallel_tool_calls: false`. A response without
a stream feeds the whole text at once through the same object, so both forms agree.
"""

from __future__ import annotations

import uuid
from typing import Any

from tokenrouter.runtime.http.tool_parsers import ToolCall
from tokenrouter.runtime.http.tools import ToolUse

__all__ = ["ToolReply", "ToolText"]


class ToolText:
    """One reply's text, split into text and calls as it arrives (`feed`, then `finish`)."""

    def __init__(self, use: ToolUse):
        self.use = use
        self.held = ""  # text not given back yet
        self.gap = ""  # the whitespace dropped before the open call (given back if it is malformed)
        self.open = False  # inside a call: after its start marker
        self.after_call = False  # the text so far ends with a call: leading whitespace is dropped
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self.held += text
        out: list[str | ToolCall] = []
        p = self.use.parser
        while True:
            if self.open:
                j = self.held.find(p.end)
                if j < 0:
                    return out
                body, self.held = self.held[:j], self.held[j + len(p.end):]
                self._close(body, p.end, out)
                continue
            i = self.held.find(p.start)
            if i >= 0:
                before, self.held = self.held[:i], self.held[i + len(p.start):]
                self._text(before.rstrip(), out)
                self.gap = before[len(before.rstrip()):]
                self.open = True
                continue
            keep = _prefix_tail(self.held, p.start)  # may open a call
            safe = self.held[:len(self.held) - keep]
            cut = len(safe.rstrip())  # whitespace waits: a call may follow
            self._text(safe[:cut], out)
            self.held = self.held[cut:]
            return out

    def finish(self) -> list[str | ToolCall]:
        """What is left: a call left open is read to the end of the text."""
        out: list[str | ToolCall] = []
        if self.open:
            body, self.held = self.held, ""
            self._close(body, "", out)
        elif not (self.after_call and not self.held.strip()):
            self._text(self.held, out)
        self.held = ""
        return out

    def _close(self, body: str, end: str, out: list) -> None:
        self.open = False
        call = self.use.parser.call(body.strip(), self.use.names)
        if call is not None and (self.use.parallel or self.calls == 0):
            self.calls += 1
            self.after_call = True
            out.append(call)
        else:
            self.after_call = False
            self._text(self.gap + self.use.parser.start + body + end, out)

    def _text(self, text: str, out: list) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            self.after_call = False
            out.append(text)


def _prefix_tail(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ToolReply:
    """One choice's reply with tools in use: its message or its stream deltas, and its finish
    reason ("tool_calls" when it called and ended by itself)."""

    def __init__(self, use: ToolUse):
        self.split = ToolText(use)
        self.ids: list[str] = []

    def delta(self, text: str, last: bool) -> dict[str, Any]:
        """The stream delta for the next piece of text (`last`: the reply ends with it)."""
        pieces = self.split.feed(text) + (self.split.finish() if last else [])
        content = "".join(p for p in pieces if isinstance(p, str))
        calls = [self._call(p) for p in pieces if isinstance(p, ToolCall)]
        out: dict[str, Any] = {"content": content} if content else {}
        if calls:
            out["tool_calls"] = calls
        return out

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as an assistant message (content null when it only called)."""
        pieces = self.split.feed(text) + self.split.finish()
        content = "".join(p for p in pieces if isinstance(p, str))
        calls = [self._call(p) for p in pieces if isinstance(p, ToolCall)]
        out: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            out["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.ids and reason == "stop" else reason

    def _call(self, call: ToolCall) -> dict[str, Any]:
        self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return {"index": len(self.ids) - 1, "id": self.ids[-1], "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
