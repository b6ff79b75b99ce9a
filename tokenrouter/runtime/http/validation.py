"""Checks that turn an HTTP request into token ids and its `SamplingParams`.

Anything malformed or unsupported is a `BadRequest` (HTTP 400 with an OpenAI-style body)
before the runtime sees it: an unknown model, options this server does not implement,
token ids outside the vocabulary, a prompt longer than the context, `max_tokens` over
what the context or the server allows, a request needing more KV blocks than exist,
sampling parameters outside `SamplingParams`' bounds. The tokenizer's end-of-sequence ids
join the stop ids unless `ignore_eos` (`SamplingParams.with_eos`). Tokenisation and chat
templates run in worker threads, so the event loop keeps answering.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS, SamplingParams, invalid_because
from tokenrouter.runtime.frontend.frontend import Frontend
from tokenrouter.runtime.http.protocol import BadRequest, ChatRequest, CommonRequest, check_text


class Validator:
    """What the checks need: the runtime's geometry (`Frontend`), the tokenizer, the limits."""

    def __init__(self, frontend: Frontend, tokenizer, served_name: str, max_tokens_limit: int | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS):
        self.fe = frontend
        self.tok = tokenizer
        self.name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.default_max_tokens = default_max_tokens
        self.token_bytes = longest_token_bytes(tokenizer)

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
    def check_common(self, req: CommonRequest) -> None:
        if req.model is not None and req.model != self.name:
            raise BadRequest(f"model {req.model!r} is not served here; this server serves {self.name!r}", "model")
        if req.n != 1 or (req.best_of not in (None, 1)):
            raise BadRequest("only n = 1 is supported", "n")
        if req.logprobs not in (None, False, 0):
            raise BadRequest("logprobs are not supported", "logprobs")
        if req.echo:
            raise BadRequest("echo is not supported", "echo")
        if req.presence_penalty or req.frequency_penalty:
            raise BadRequest("presence and frequency penalties are not supported", "presence_penalty")
        if req.stop:
            raise BadRequest("stop strings are not supported; use stop_token_ids", "stop")
        for name in ("tools", "tool_choice", "functions", "function_call"):
            if getattr(req, name) not in (None, [], "none"):
                raise BadRequest(f"{name} (tool and function calling) is not supported by this server", name)
        rf = req.response_format
        if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text" and len(rf) == 1):
            raise BadRequest("response_format (JSON mode, structured outputs) is not supported; "
                             "only {\"type\": \"text\"}", "response_format")
        if req.logit_bias:
            raise BadRequest("logit_bias is not supported", "logit_bias")
        vocab = self.fe.vocab_size
        for t in req.stop_token_ids or ():
            if not 0 <= t < vocab:
                raise BadRequest(f"stop token id {t} is outside the vocabulary (0..{vocab - 1})", "stop_token_ids")

    async def prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            raise BadRequest("only one prompt per request is supported", "prompt")
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

    async def chat_ids(self, req: ChatRequest) -> list[int]:
        """The prompt of a chat request: its messages through the model's chat template."""
        messages = []
        for m in req.messages:
            content = m.content
            if isinstance(content, list):
                content = "".join(text_part(p) for p in content)
            messages.append({"role": m.role, "content": check_text(content or "", "messages")})
        try:
            ids = await asyncio.to_thread(self.tok.apply_chat_template, messages, add_generation_prompt=True)
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

    def sampling(self, req: CommonRequest, prompt_len: int, max_tokens: int | None) -> SamplingParams:
        """The request's typed sampling parameters; `max_tokens` None takes the server's default."""
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
        try:
            params = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                                    max_tokens=max_tokens, stop_token_ids=tuple(req.stop_token_ids or ()))
            return params.with_eos(self.tok.eos_token_ids, req.ignore_eos)
        except ValidationError as exc:
            where, why = invalid_because(exc)
            raise BadRequest(f"invalid sampling parameters: {why}", where.split(".")[0]) from None


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

