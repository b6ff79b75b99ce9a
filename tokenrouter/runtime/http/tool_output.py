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
call after the first when the request said `parallel_tool_calls: false`. A parser whose
family also writes calls without markers (`ToolParser.bare`) has a JSON object read as a call
where the reply opens with it or a call precedes it (whitespace and a ```json fence around
it allowed); such a reply is held back until the object closes, and an object that is no
call is text like any other. A response without a stream feeds the whole text at once
through the same object, so both forms agree.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from tokenrouter.runtime.http.tool_parsers import ToolCall
from tokenrouter.runtime.http.tools import ToolUse

__all__ = ["ToolReply", "ToolText"]

FENCE = re.compile(r"```(?:json)?[ \t]*\n")  # a code fence's first line around a bare call
FENCE_SO_FAR = re.compile(r"`{1,3}(?:j(?:s(?:on?)?)?)?[ \t]*")  # ... not yet whole


class ToolText:
    """One reply's text, split into text and calls as it arrives (`feed`, then `finish`)."""

    def __init__(self, use: ToolUse):
        self.use = use
        self.held = ""  # text not given back yet
        self.gap = ""  # the whitespace dropped before the open call (given back if it is malformed)
        self.open = False  # inside a call: after its start marker
        self.after_call = False  # the text so far ends with a call: leading whitespace is dropped
        self.bare_next = use.parser.bare  # a bare call may come next: the reply's start, or after a call
        self.bare_end = _ObjectEnd()  # the scan of the bare object being held, if any
        self.calls = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        self.held += text
        out: list[str | ToolCall] = []
        p = self.use.parser
        while True:
            if self.bare_next and not self.open:
                read = self._bare(out)
                if read is None:
                    return out  # not yet clear
                if read:
                    continue
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
        if self.bare_next and not self.open:
            while self._bare(out, final=True):
                pass
            out += self.feed("")  # the rest reads as any text
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
        if self._takes(call):
            self._called(call, out)
        else:
            self.after_call = False
            self._text(self.gap + self.use.parser.start + body + end, out)

    def _takes(self, call: ToolCall | None) -> bool:
        """A call was read and may be one: the first, or any with `parallel_tool_calls`."""
        return call is not None and (self.use.parallel or self.calls == 0)

    def _called(self, call: ToolCall, out: list) -> None:
        self.calls += 1
        self.after_call, self.bare_next, self.bare_end = True, self.use.parser.bare, _ObjectEnd()
        out.append(call)

    def _bare(self, out: list, final: bool = False) -> bool | None:
        """A bare call at the start of what is held: read (True; it and the whitespace and
        fence around it are consumed), none (False), or not yet clear (None)."""
        body = self.held.lstrip()
        fence = FENCE.match(body)
        if not final and (not body or (fence is None and FENCE_SO_FAR.fullmatch(body))):
            return None
        k = fence.end() if fence else 0
        k += len(body[k:]) - len(body[k:].lstrip())
        if k == len(body) and fence is not None and not final:
            return None
        if k == len(body) or body[k] != "{":
            return self._no_bare()
        end = self.bare_end(body, k)
        if end is None:
            return self._no_bare() if final else None
        call = self.use.parser.call(body[k:end], self.use.names)
        if not self._takes(call):
            return self._no_bare()
        if fence is not None:
            tail = body[end:].lstrip()
            if tail.startswith("```"):
                end = len(body) - len(tail) + 3
            elif not final and "```".startswith(tail):
                return None
            elif tail:
                return self._no_bare()
        self.held = body[end:]
        self._called(call, out)
        return True

    def _no_bare(self) -> bool:
        self.bare_next = False
        return False

    def _text(self, text: str, out: list) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            self.after_call = False
            out.append(text)


class _ObjectEnd:
    """Where the JSON object opening at `text[k]` closes (the index after its brace), by its
    braces outside strings; None while it is still open. Text streams in: each call reads
    on from where the last stopped, so a long object costs its length once."""

    def __init__(self):
        self.pos: int | None = None
        self.depth, self.in_string, self.escaped = 0, False, False
        self.found: int | None = None

    def __call__(self, text: str, k: int) -> int | None:
        if self.found is not None:
            return self.found
        for i in range(k if self.pos is None else self.pos, len(text)):
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c == "{":
                self.depth += 1
            elif c == "}":
                self.depth -= 1
                if self.depth == 0:
                    self.found = i + 1
                    return self.found
        self.pos = len(text)
        return None


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
