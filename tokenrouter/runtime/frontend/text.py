"""A request's output as text: incremental detokenisation and stop strings.

The frontend is the one place that sees every token of a request in order, whichever
writer committed it, so stop strings are matched here, on the detokenised text: a match may
span tokens of different writers. As in vLLM, text that could still be the start of a stop
string is held back, the matched string (and anything after it) is never released unless
`include_stop_str_in_output`, and the request ends at the token that completed the match.
Stop *ids* (end-of-sequence included) end a request in its writer's step; their tokens give
no text.
"""

from __future__ import annotations

from typing import Sequence


class Detokenizer:
    """Incremental decoding: emits text only once it is stable (no partial UTF-8 character),
    so the concatenated pieces equal decoding all tokens at once."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.emitted = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        prefix_text = self._decode(self.ids[self.prefix:self.read])
        new_text = self._decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix, self.read = self.read, len(self.ids)
            self.emitted += delta
            return delta
        return ""

    def finish(self) -> str:
        full = self._decode(self.ids)
        rest = full[len(self.emitted):] if full.startswith(self.emitted) else ""
        self.emitted += rest
        return rest


class TextStream:
    """One request's text: `push` each token in order; it returns the text now safe to
    release, and sets `matched` (the stop string) when a stop string completes."""

    def __init__(self, tokenizer, stop: Sequence[str] = (), stop_ids: Sequence[int] = (),
                 include_stop_str: bool = False, skip_special_tokens: bool = True):
        self.detok = Detokenizer(tokenizer, skip_special_tokens)
        self.stop = tuple(stop)
        self.stop_ids = frozenset(stop_ids)
        self.include = include_stop_str
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # chars that may start a match
        self.text = ""  # decoded so far (up to the match, once there is one)
        self.released = 0  # chars of `text` released
        self.matched: str | None = None

    def push(self, token: int) -> str:
        if self.matched is not None:
            raise ValueError("TextStream: a stop string already matched")
        if token in self.stop_ids:
            return ""
        return self._add(self.detok.push([token]))

    def finish(self) -> str:
        """The rest of the text once the request ended (nothing more after a match)."""
        if self.matched is not None:
            return ""
        out = self._add(self.detok.finish())
        return out + (self._release(len(self.text)) if self.matched is None else "")

    def _add(self, piece: str) -> str:
        if not piece:
            return ""
        start = max(0, len(self.text) - self.hold)  # a new match ends in `piece`
        self.text += piece
        if self.stop:
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                at, s = min(hits)
                self.matched = s
                self.text = self.text[:at + len(s)] if self.include else self.text[:at]
                return self._release(len(self.text))
        return self._release(max(self.released, len(self.text) - self.hold))

    def _release(self, upto: int) -> str:
        out = self.text[self.released:upto]
        self.released = max(self.released, upto)
        return out
