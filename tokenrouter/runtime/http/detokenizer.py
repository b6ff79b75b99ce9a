"""Incremental decoding of a token stream into text, for streamed responses.

Used by the HTTP API's server-sent events (`completions.py`); `tokenrouter generate`
prints its tokens the same way.
"""

from __future__ import annotations


class Detokenizer:
    """Incremental decoding for streams: emits text only once it is stable (no partial
    UTF-8 character), so the concatenated stream equals decoding all tokens at once."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        new_text = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix, self.read = self.read, len(self.ids)
            self.emitted += delta
            return delta
        return ""

    def finish(self) -> str:
        full = self.tok.decode(self.ids, skip_special_tokens=True)
        rest = full[len(self.emitted):] if full.startswith(self.emitted) else ""
        self.emitted += rest
        return rest

