"""Checks that turn an HTTP request into token ids and its `SamplingParams`.

Anything malformed or unsupported is a `BadRequest` (HTTP 400 with an OpenAI-style body)
before the runtime sees it: a model not served here, options this server does not
implement (`UNSUPPORTED`), token ids outside the vocabulary, a prompt longer than the
context, `max_tokens` over what the context or the server allows, a request needing more KV
blocks than exist, a structured-output spec that does not compile, sampling parameters
outside `SamplingParams`' bounds. The tokenizer's end-of-sequence ids join the stop ids
unless `ignore_eos` (`SamplingParams.with_eos`). Tokenisation, chat templates and grammar
checks run in worker threads, so the event loop keeps answering.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import ValidationError

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams, Structured, invalid_because
from tokenrouter.runtime.engine.grammar import Grammars
from tokenrouter.runtime.frontend.frontend import Frontend
from tokenrouter.runtime.http.protocol import (BadRequest, ChatMessage, ChatRequest, CommonRequest, CompletionRequest,
                                               check_text)

#: Request fields this server refuses when set, and why (a client relying on them must know).
UNSUPPORTED = {
    "best_of": "best_of > 1 is not supported (vLLM removed it too); use n",
    "use_beam_search": "beam search is not supported",
    "prompt_logprobs": "prompt logprobs are not supported (the engine returns the last position's logits only)",
    "logprob_token_ids": "logprob_token_ids is not supported",
    "allowed_token_ids": "allowed_token_ids is not supported; use logit_bias or structured_outputs",
    "bad_words": "bad_words is not supported; use logit_bias",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported",
    "suffix": "suffix (insertion) is not supported",
}
TOOLS = ("tools", "tool_choice", "functions", "function_call")


class Validator:
    """What the checks need: the runtime's geometry (`Frontend`), the tokenizer, the names
    served, the limits."""

    def __init__(self, frontend: Frontend, tokenizer, names: tuple[str, ...], max_tokens_limit: int | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS):
        self.fe = frontend
        self.tok = tokenizer
        self.names = tuple(names)
        self.max_tokens_limit = max_tokens_limit
        self.default_max_tokens = default_max_tokens
        self.token_bytes = longest_token_bytes(tokenizer)
        self.grammars = Grammars(tokenizer)

    # ------------------------------------------------------------ tokenising
    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokens of a prompt, in a worker thread. A text with more UTF-8 bytes than the
        context could hold even at the longest token's length is refused without
        tokenising it at all."""
        n = len(text.encode("utf-8"))
        ctx = self.fe.max_model_len
        if self.token_bytes and n > ctx * self.token_bytes:
            raise BadRequest(f"the prompt has at least {n // self.token_bytes} tokens; the context holds "
                             f"{ctx} (the prompt is longer than the context)", "prompt")
        return await asyncio.to_thread(self.tok.encode, text, add_special_tokens=add_special_tokens)

    # ------------------------------------------------------------ validation
    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            served = ", ".join(repr(n) for n in self.names)
            raise BadRequest(f"model {model!r} is not served here; this server serves {served}", "model")

    def check_common(self, req: CommonRequest) -> None:
        self.check_model(req.model)
        for name, why in UNSUPPORTED.items():
            fine = (None, False, []) + ((1,) if name == "best_of" else ())
            if getattr(req, name, None) not in fine:
                raise BadRequest(why, name)
        for name in TOOLS:
            if getattr(req, name) not in (None, [], "none"):
                raise BadRequest(f"{name} (tool and function calling) is not supported by this server; "
                                 f"response_format with a json_schema constrains the output instead", name)
        if req.stream_options is not None and not req.stream:
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
        if req.stream_options is not None and req.stream_options.continuous_usage_stats:
            raise BadRequest("stream_options.continuous_usage_stats is not supported; include_usage is",
                             "stream_options")
        vocab = self.fe.vocab_size
        for t in req.stop_token_ids or ():
            if not 0 <= t < vocab:
                raise BadRequest(f"stop token id {t} is outside the vocabulary (0..{vocab - 1})", "stop_token_ids")

    async def prompts(self, req: CompletionRequest) -> list[list[int]]:
        """The prompts of a completion request (a string, token ids, or a list of either)."""
        prompt = req.prompt
        many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        out = [await self._prompt_ids(p) for p in (prompt if many else [prompt])]
        if not out:
            raise BadRequest("the prompt is empty", "prompt")
        return out

    async def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = await self.encode(check_text(prompt, "prompt"))
        else:
            ids = list(prompt)
            if len(ids) >= self.fe.max_model_len:
                raise BadRequest(f"the prompt has {len(ids)} tokens; the context holds {self.fe.max_model_len} "
                                 f"(the prompt is longer than the context)", "prompt")
            vocab = self.fe.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise BadRequest(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "prompt")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt")
        return ids

    async def chat_ids(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        """The prompt of a chat request: its messages through the model's chat template."""
        rendered = []
        for m in messages:
            content = m.content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if p.get("type") == "text"]
                if len(parts) != len(content):
                    raise BadRequest("only text content parts are supported", "messages")
                content = "".join(parts)
            rendered.append({"role": m.role, "content": check_text(content or "", "messages")})
        try:
            ids = await asyncio.to_thread(self.tok.apply_chat_template, rendered,
                                          add_generation_prompt=add_generation_prompt)
        except Exception as exc:
            raise BadRequest(f"cannot apply the chat template: {exc}", "messages") from None
        if isinstance(ids, str):
            ids = await self.encode(ids, add_special_tokens=False)
        if not ids:
            raise BadRequest("the conversation is empty", "messages")
        vocab = self.fe.vocab_size
        ids = list(ids)
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest("the chat template produced tokens outside the model's vocabulary", "messages")
        return ids

    def max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """`max_tokens` checked against the context, the server's limit and the KV cache;
        None takes the server's default."""
        ctx = self.fe.max_model_len
        if prompt_len >= ctx:
            raise BadRequest(f"the prompt has {prompt_len} tokens; the context holds {ctx} "
                             f"(the prompt is longer than the context)", "prompt")
        room = ctx - prompt_len
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, room)
        limit = min(room, self.max_tokens_limit or room)
        if max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        if max_tokens > limit:
            why = (f"the context of {ctx} tokens leaves {room} after the {prompt_len}-token prompt"
                   if limit == room else f"this server allows at most {limit}")
            raise BadRequest(f"max_tokens {max_tokens} is over the limit: {why}", "max_tokens")
        blocks = self.fe.blocks_needed(prompt_len, max_tokens)
        if blocks > self.fe.capacity_blocks:
            raise BadRequest(f"the request needs {blocks} KV blocks; the cache has {self.fe.capacity_blocks}",
                             "max_tokens")
        return max_tokens

    async def sampling(self, req: CommonRequest, logprobs: int | None) -> SamplingParams:
        """The request's typed sampling parameters, without `max_tokens` (`with_max_tokens`)."""
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
        for s in stop:
            check_text(s, "stop")
        fields: dict[str, Any] = dict(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0), min_p=req.min_p or 0.0, seed=req.seed,
            stop_token_ids=tuple(req.stop_token_ids or ()), stop=tuple(stop),
            include_stop_str_in_output=req.include_stop_str_in_output, min_tokens=req.min_tokens,
            presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=self._logit_bias(req.logit_bias), logprobs=logprobs,
            structured=await self.structured(req))
        try:
            params = SamplingParams(**fields)
            return params.with_eos(self.tok.eos_token_ids, req.ignore_eos)
        except ValidationError as exc:
            where, why = invalid_because(exc)
            raise BadRequest(f"invalid sampling parameters: {why}", where.split(".")[0]) from None

    def _logit_bias(self, bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
        out = []
        for key, value in (bias or {}).items():
            try:
                tid = int(key)
            except ValueError:
                raise BadRequest(f"logit_bias keys are token ids, got {key!r}", "logit_bias") from None
            if not 0 <= tid < self.fe.vocab_size:
                raise BadRequest(f"logit_bias token id {tid} is outside the vocabulary "
                                 f"(0..{self.fe.vocab_size - 1})", "logit_bias")
            out.append((tid, value))
        return tuple(out)

    async def structured(self, req: CommonRequest) -> Structured | None:
        """The structured-output spec of `response_format` or vLLM's `structured_outputs`,
        compiled once here (in a worker thread) so a bad one is a 400."""
        spec, param = structured_spec(req)
        if spec is None:
            return None
        error = await asyncio.to_thread(self.grammars.check, spec)
        if error:
            raise BadRequest(f"{param}: {error}", param)
        return spec


def structured_spec(req: CommonRequest) -> tuple[Structured | None, str]:
    """(the spec, the field it came from) of a request; a malformed one is a 400."""
    rf, so = req.response_format, req.structured_outputs
    if rf is not None and so is not None:
        raise BadRequest("give response_format or structured_outputs, not both", "structured_outputs")
    if rf is not None:
        kind = rf.get("type")
        if kind == "text":
            return None, "response_format"
        if kind == "json_object":
            return Structured(kind="json"), "response_format"
        if kind == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema")
            if not isinstance(schema, (dict, bool)):
                raise BadRequest("response_format json_schema needs json_schema.schema, an object", "response_format")
            return Structured(kind="json_schema", spec=json.dumps(schema)), "response_format"
        raise BadRequest(f"response_format type {kind!r} is not one of text, json_object, json_schema",
                         "response_format")
    if so is None:
        return None, ""
    given = {k: v for k, v in so.items() if v not in (None, False)}
    kinds = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark", "json_object": "json"}
    unknown = sorted(set(given) - set(kinds))
    if unknown or len(given) != 1:
        raise BadRequest("structured_outputs takes exactly one of json, regex, choice, grammar, json_object"
                         + (f" (not {', '.join(unknown)})" if unknown else ""), "structured_outputs")
    (key, value), = given.items()
    if key == "json_object":
        return Structured(kind="json"), "structured_outputs"
    if key in ("json", "choice") and not isinstance(value, str):
        value = json.dumps(value)
    if not isinstance(value, str):
        raise BadRequest(f"structured_outputs.{key} must be a string", "structured_outputs")
    return Structured(kind=kinds[key], spec=value), "structured_outputs"


def chat_logprobs(req: ChatRequest) -> int | None:
    """Chat's `logprobs` / `top_logprobs` as the number of top log-probabilities (None: none)."""
    if req.top_logprobs is not None and not req.logprobs:
        if req.top_logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    if not req.logprobs:
        return None
    k = req.top_logprobs or 0
    if k > MAX_LOGPROBS:
        raise BadRequest(f"top_logprobs is at most {MAX_LOGPROBS}, got {k}", "top_logprobs")
    return k


def completion_logprobs(req: CompletionRequest) -> int | None:
    if req.logprobs is not None and req.logprobs > MAX_LOGPROBS:
        raise BadRequest(f"logprobs is at most {MAX_LOGPROBS}, got {req.logprobs}", "logprobs")
    if req.echo and req.logprobs is not None:
        raise BadRequest("echo with logprobs needs prompt logprobs, which are not supported", "echo")
    return req.logprobs


def longest_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes one token decodes to (for the cheap too-long check)."""
    try:
        n = int(tokenizer.vocab_size)
        return max(len(tokenizer.decode([i]).encode("utf-8", "replace")) for i in range(n)) or None
    except Exception:
        return None
