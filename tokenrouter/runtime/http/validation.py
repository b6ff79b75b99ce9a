"""Checks that turn an HTTP request into token ids and its `SamplingParams`.

Anything malformed or unsupported is a `BadRequest` (HTTP 400 with an OpenAI-style body)
before the runtime sees it: a model not served here, fields this server does not implement
(`fields.py`), token ids outside the vocabulary, a prompt longer than the context,
`max_tokens` over what the context or the server allows (or under `min_tokens`), a request
needing more KV blocks than exist, a structured-output spec that does not compile, sampling
parameters outside `SamplingParams`' bounds. A chat prompt is the messages through the
model's chat template, with the variables vLLM gives it (`template_variables`); a message of
a custom role goes to the template as it is, and one the template cannot render is a 400. The
tokenizer's end-of-sequence ids join the stop ids unless `ignore_eos`
(`SamplingParams.with_eos`). Tokenisation, chat templates and grammar checks run in worker
threads, so the event loop keeps answering.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from pydantic import ValidationError

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams, Structured, invalid_because
from tokenrouter.runtime.engine.grammar import Grammars
from tokenrouter.runtime.frontend.frontend import Frontend
from tokenrouter.runtime.http import fields
from tokenrouter.runtime.http.schema import (STANDARD_ROLES, BadRequest, ChatMessage, ChatRequest, CommonRequest,
                                             CompletionRequest, check_text)
from tokenrouter.runtime.http.tools import template_calls

#: `chat_template_kwargs` a request may not set: the template's source, how it is applied, its messages
RESERVED_TEMPLATE_KWARGS = ("chat_template", "tokenize", "messages")


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
        fields.check(req)
        if req.request_id is not None:
            check_text(req.request_id, "request_id")
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
        if prompt is None:
            raise BadRequest("prompt: Field required (a text, token ids, or a list of either)", "prompt")
        many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        out = [await self._prompt_ids(p, req.add_special_tokens) for p in (prompt if many else [prompt])]
        if not out:
            raise BadRequest("the prompt is empty", "prompt")
        return out

    async def _prompt_ids(self, prompt, add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            ids = await self.encode(check_text(prompt, "prompt"), add_special_tokens)
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

    async def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                          add_special_tokens: bool = False,
                          variables: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        """The prompt of a chat request, as text and token ids: its messages through the
        model's chat template (with `variables`, `template_variables`), then tokenised, with
        the tokenizer's special tokens when `add_special_tokens`."""
        rendered = [template_message(m) for m in messages]
        if not self.tok.chat_template:
            raise BadRequest("the model has no chat template: add one to its folder (a \"chat_template\" in "
                             "tokenizer_config.json, or a chat_template.jinja file; docs/models.md, \"Serving your "
                             "own models\"), or send a plain prompt to /v1/completions", "messages")
        text = await asyncio.to_thread(self._render, rendered, add_generation_prompt, variables or {})
        try:  # the messages are checked: only the template's variables can bring a lone surrogate
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("chat_template_kwargs, documents or tools hold text that is not valid Unicode (a lone "
                             "surrogate)", "chat_template_kwargs") from None
        ids = await self.encode(text, add_special_tokens=add_special_tokens)
        if not ids:
            raise BadRequest("the conversation is empty", "messages")
        vocab = self.fe.vocab_size
        ids = list(ids)
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest("the chat template produced tokens outside the model's vocabulary", "messages")
        return text, ids

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any]) -> str:
        """The messages through the chat template. A message of a role outside
        `STANDARD_ROLES` must reach the prompt: a template that raises on it, or does not
        write its text (it drops roles it does not know; probed with the text replaced by a
        marker), gets a 400 naming the role."""
        def apply(ms: list[dict[str, Any]]) -> str:
            return self.tok.apply_chat_template(ms, add_generation_prompt=add_generation_prompt, **variables)
        custom = [i for i, m in enumerate(messages) if m["role"] not in STANDARD_ROLES]
        try:
            text = apply(messages)
        except Exception as exc:
            if custom:
                raise BadRequest(f"the chat template cannot render a message with role {messages[custom[0]]['role']!r}"
                                 f" (or the conversation): {exc}", "messages") from None
            raise BadRequest(f"cannot apply the chat template: {exc}", "messages") from None
        for i in custom:
            marker = f"[{uuid.uuid4().hex}]"
            try:
                written = marker in apply([*messages[:i], {**messages[i], "content": marker}, *messages[i + 1:]])
            except Exception:
                written = False
            if not written:
                raise BadRequest(f"the model's chat template does not render a message with role "
                                 f"{messages[i]['role']!r} (its text does not reach the prompt); use one of "
                                 f"{', '.join(STANDARD_ROLES)}", f"messages[{i}].role")
        return text

    def max_tokens(self, prompt_len: int, max_tokens: int | None, min_tokens: int = 0) -> int:
        """`max_tokens` checked against the context, the server's limit, the KV cache and
        `min_tokens` (vLLM refuses more than `max_tokens` too); None takes the server's default."""
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
        if min_tokens > max_tokens:
            raise BadRequest(f"min_tokens {min_tokens} is more than max_tokens {max_tokens}", "min_tokens")
        blocks = self.fe.blocks_needed(prompt_len, max_tokens)
        if blocks > self.fe.capacity_blocks:
            raise BadRequest(f"the request needs {blocks} KV blocks; the cache has {self.fe.capacity_blocks}",
                             "max_tokens")
        return max_tokens

    async def sampling(self, req: CommonRequest, logprobs: int | None,
                       forced: Structured | None = None) -> SamplingParams:
        """The request's typed sampling parameters, without `max_tokens` (`with_max_tokens`);
        `forced`: the grammar of a reply that must call a tool (`tools.forced_calls`)."""
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
            structured=await self.structured(req, forced))
        if fields["structured"] is not None and req.ignore_eos:
            raise BadRequest("ignore_eos cannot hold with structured output: the output ends where its grammar "
                             "does (at the end-of-sequence token)", "ignore_eos")
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

    async def structured(self, req: CommonRequest, forced: Structured | None = None) -> Structured | None:
        """The structured-output spec of `response_format` or vLLM's `structured_outputs`, or
        the grammar of a forced tool call, compiled once here (in a worker thread) so a bad
        one is a 400."""
        spec, param = structured_spec(req)
        if forced is not None:
            if spec is not None:
                raise BadRequest(f"{param} cannot hold with tool_choice required or a named function (the call's "
                                 f"grammar constrains the output)", param)
            spec, param = forced, "tools"
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
            given = rf.get("json_schema")
            schema = given.get("schema") if isinstance(given, dict) else None
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


def template_variables(kwargs: dict[str, Any] | None, documents: list | None = None,
                       reasoning_effort: str | None = None, tools: list | None = None) -> dict[str, Any]:
    """The chat template's variables besides the messages, as vLLM builds them: the request's
    `chat_template_kwargs`, with its `documents`, `reasoning_effort` and `tools` over them when given,
    and `enable_thinking` (false for effort "none") unless the kwargs set it. The request's
    `add_generation_prompt` field wins over the kwargs' (`Validator.chat_prompt`)."""
    out = dict(kwargs or {})
    reserved = [k for k in RESERVED_TEMPLATE_KWARGS if k in out]
    if reserved:
        raise BadRequest(f"chat_template_kwargs may not set {reserved[0]!r}", "chat_template_kwargs")
    out.pop("add_generation_prompt", None)
    if documents is not None:
        out["documents"] = documents
    if tools is not None:
        out["tools"] = tools
    if reasoning_effort is not None:
        out["reasoning_effort"] = reasoning_effort
        out.setdefault("enable_thinking", reasoning_effort != "none")
    return out


def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as the chat template sees it (vLLM's keys): its text (text parts joined), and
    `name`, `task`, a tool message's `tool_call_id`, an assistant's `reasoning` (also as
    `reasoning_content`) and `tool_calls` (`tools.template_calls`) when given."""
    content = m.content
    if isinstance(content, list):
        content = "".join(text_part(p) for p in content)
    out: dict[str, Any] = {"role": check_text(m.role, "messages"), "content": check_text(content or "", "messages")}
    given = {"name": m.name, "task": m.task, "tool_call_id": m.tool_call_id if m.role == "tool" else None}
    if m.role == "assistant" and m.reasoning is not None:
        given.update(reasoning=m.reasoning, reasoning_content=m.reasoning)
    out.update((k, check_text(v, "messages")) for k, v in given.items() if v is not None)
    if m.tool_calls:
        out["tool_calls"] = template_calls(m.tool_calls, "messages")
    return out


def text_part(part: dict) -> str:
    """The text of a chat content part: `{"type": "text", "text": "..."}` and nothing else."""
    if part.get("type") != "text":
        raise BadRequest("only text content parts are supported", "messages")
    text = part.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"a text content part's `text` must be a string, got {type(text).__name__}", "messages")
    return text


def longest_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes one token decodes to (for the cheap too-long check)."""
    try:
        n = int(tokenizer.vocab_size)
        return max(len(tokenizer.decode([i]).encode("utf-8", "replace")) for i in range(n)) or None
    except Exception:
        return None
