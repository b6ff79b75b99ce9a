"""Structured output: a request's `Structured` spec (`protocol/sampling.py`) as a token mask,
on llguidance (a Rust library with no Python dependencies, used by vLLM, SGLang and
llama.cpp for the same job).

`Grammars` holds one tokenizer's llguidance form (built once, about 0.5 s for a 49k
vocabulary) and turns a spec into a `GrammarState`: a matcher and how many output tokens
it has consumed. Every writer keeps one state per request and calls `advance(output)`
before each step, which consumes the output tokens it has not seen: its own last token, or
the whole suffix other writers wrote while the request was away (so the state follows the
request across handoffs without crossing the wire). `allowed(vocab)` is then the step's
mask over the vocabulary. `check` tells why a spec cannot compile, for a 400 at the door.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tokenrouter.protocol.sampling import Structured

__all__ = ["GrammarError", "GrammarState", "Grammars", "grammar_text"]


class GrammarError(ValueError):
    """A spec that does not compile, or output its grammar does not accept."""


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a core dependency: only a broken installation lacks it
        raise GrammarError('structured output needs llguidance: pip install "tokenrouter"') from None
    return llguidance


#: JSON is written compactly (`", "` and `": "` between items, no other whitespace) unless a
#: schema's `x-guidance` says otherwise: free whitespace lets a weak model pad forever.
JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_text(spec: Structured) -> str:
    """llguidance's grammar for a spec (not yet checked against a tokenizer)."""
    llg = _llguidance()
    if spec.kind == "json":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.spec)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError("a JSON schema is an object")
        try:
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"invalid JSON schema: {exc}") from None
    if spec.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.spec)
    if spec.kind == "lark":
        return llg.LLMatcher.grammar_from_lark(spec.spec)
    try:  # kind == "choice"
        choices = json.loads(spec.spec)
    except ValueError as exc:
        raise GrammarError(f"choice is not JSON: {exc}") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("choice is a non-empty list of strings")
    return llg.LLMatcher.grammar_from_regex("|".join(f"(?:{re.escape(c)})" for c in choices))


class GrammarState:
    """One request's matcher, and how many of its output tokens it has consumed."""

    def __init__(self, matcher, vocab: int):
        self.matcher = matcher
        self.vocab = vocab  # the tokenizer's
        self.consumed = 0
        self._bits = np.zeros((-(-vocab // 32),), dtype=np.int32)

    def advance(self, output: Sequence[int]) -> None:
        """Consume the output tokens not consumed yet (`output` is every output token so far)."""
        new = list(output[self.consumed:])
        if new and not self.matcher.consume_tokens(new):
            raise GrammarError(f"structured output: the grammar refuses output token {self.consumed} "
                               f"onwards: {self.matcher.get_error()}")
        self.consumed = len(output)

    def allowed(self, vocab: int) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar allows next (ids past the tokenizer's: never)."""
        m = self.matcher
        if m.is_error():
            raise GrammarError(f"structured output: {m.get_error()}")
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab].astype(bool)
        out = torch.zeros(vocab, dtype=torch.bool)
        n = min(vocab, self.vocab)
        out[:n] = torch.from_numpy(bits[:n])
        return out

    @property
    def finished(self) -> bool:
        """The grammar accepts no further token (only end-of-sequence)."""
        return self.matcher.is_stopped()


class Grammars:
    """Compiles specs for one tokenizer (`runtime/loader/tokenizer.Tokenizer`, or a function
    that loads it: a subserver loads it only when a request asks for structured output); the
    tokenizer's llguidance form is built on first use."""

    def __init__(self, tokenizer=None, load: Callable[[], Any] | None = None):
        if (tokenizer is None) == (load is None):
            raise ValueError("Grammars: give a tokenizer or a function that loads it")
        self._tokenizer, self._load = tokenizer, load
        self._ll = None

    @property
    def ll_tokenizer(self):
        if self._ll is None:
            llg = _llguidance()
            if self._tokenizer is None:
                self._tokenizer = self._load()
            tok = self._tokenizer
            self._ll = llg.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                                       eos_token=list(tok.eos_token_ids) or None)
        return self._ll

    def check(self, spec: Structured) -> str | None:
        """Why `spec` does not compile, or None."""
        try:
            text = grammar_text(spec)
        except GrammarError as exc:
            return str(exc)
        error = _llguidance().LLMatcher.validate_grammar(text, self.ll_tokenizer)
        return None if not error or error.startswith("WARNING") else error

    def state(self, spec: Structured) -> GrammarState:
        m = _llguidance().LLMatcher(self.ll_tokenizer, grammar_text(spec))
        if m.is_error():
            raise GrammarError(f"structured output: {m.get_error()}")
        return GrammarState(m, self.ll_tokenizer.vocab_size)
