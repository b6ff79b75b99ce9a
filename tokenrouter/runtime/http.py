"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, health, metrics.

The app only translates: it validates a request (HTTP 400 with an OpenAI-style error body
for anything malformed, so a bad client never costs a traceback or the server), turns it
into token ids, and streams what `Frontend.generate` yields back as JSON or server-sent
events. A client that disconnects aborts its request, which releases its KV everywhere.

Extensions to the OpenAI schema: `top_k`, `stop_token_ids`, `ignore_eos` in requests;
`token_ids` in each choice and `tokens_by_model` (how many tokens each model wrote) in
every response (in the final chunk when streaming).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenrouter.runtime.frontend import Delta, Final, Frontend, RuntimeUnavailable
from tokenrouter.runtime.metrics import render


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    logprobs: Any = None
    echo: bool = False
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


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


class Server:
    """Holds what the endpoints share: the runtime frontend, the tokenizer and the limits."""

    def __init__(self, frontend: Frontend, tokenizer, served_name: str, max_tokens_limit: int | None = None,
                 default_max_tokens: int = 16):
        self.fe = frontend
        self.tok = tokenizer
        self.name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())

    # ------------------------------------------------------------ validation
    def check_common(self, req: _Common) -> None:
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
        vocab = self.fe.vocab_size
        for t in req.stop_token_ids or ():
            if not 0 <= t < vocab:
                raise BadRequest(f"stop token id {t} is outside the vocabulary (0..{vocab - 1})", "stop_token_ids")

    def prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            raise BadRequest("only one prompt per request is supported", "prompt")
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt)
        else:
            ids = list(prompt)
            vocab = self.fe.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise BadRequest(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "prompt")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt")
        return ids

    def sampling(self, req: _Common, prompt_len: int, max_tokens: int | None) -> dict[str, Any]:
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
        stop = list(req.stop_token_ids or ())
        if not req.ignore_eos:
            stop += [t for t in self.tok.eos_token_ids if t not in stop]
        return {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
                "seed": req.seed, "max_tokens": max_tokens, "stop_token_ids": stop}

    # -------------------------------------------------------------- running
    async def run(self, request: Request, ids: list[int], sampling: dict[str, Any], seed: int, chat: bool,
                  stream: bool, include_usage: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        stop_ids = set(sampling["stop_token_ids"])
        gen = self.fe.generate(ids, sampling, seed=seed, rid=rid)
        if stream:
            return StreamingResponse(self._stream(gen, rid, ids, stop_ids, chat, include_usage),
                                     media_type="text/event-stream")
        watcher = asyncio.create_task(self._watch_disconnect(request, rid))
        out: list[int] = []
        writers: list[str] = []
        final: Final | None = None
        try:
            async for ev in gen:
                if isinstance(ev, Delta):
                    out += ev.tokens
                    writers += ev.writers
                else:
                    final = ev
        finally:
            watcher.cancel()
            self.fe.abort(rid)
        if final is None or final.reason == "abort":
            return _error(499, "the request was aborted", "aborted")
        if final.reason == "error":
            return _error(500, f"the request failed: {final.error}", "server_error")
        text_ids = [t for t in out if t not in stop_ids]
        text = self.tok.decode(text_ids, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "finish_reason": final.reason, "token_ids": out,
                                  "token_writers": writers}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.name, "choices": [choice], "usage": self._usage(len(ids), len(out), final),
            "tokens_by_model": final.written_by})

    @staticmethod
    def _usage(prompt_len: int, n_out: int, final: Final) -> dict[str, Any]:
        return {"prompt_tokens": prompt_len, "completion_tokens": n_out, "total_tokens": prompt_len + n_out,
                "tokens_by_model": dict(final.written_by)}

    async def _watch_disconnect(self, request: Request, rid: str) -> None:
        while True:
            await asyncio.sleep(0.25)
            if await request.is_disconnected():
                self.fe.abort(rid)
                return

    async def _stream(self, gen, rid: str, ids: list[int], stop_ids: set[int], chat: bool, include_usage: bool):
        detok = Detokenizer(self.tok)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        n_out = 0

        def chunk(text: str | None, token_ids: list[int], finish: str | None, extra: dict | None = None):
            if chat:
                delta: dict[str, Any] = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "token_ids": token_ids}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None,
                          "token_ids": token_ids}
            body = {"id": rid, "object": obj, "created": created, "model": self.name, "choices": [choice]}
            body.update(extra or {})
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': self.name, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
            async for ev in gen:
                if isinstance(ev, Delta):
                    n_out += len(ev.tokens)
                    text = detok.push([t for t in ev.tokens if t not in stop_ids])
                    yield chunk(text, ev.tokens, None)
                    continue
                if ev.reason == "error":
                    yield f"data: {json.dumps({'error': {'message': f'the request failed: {ev.error}', 'type': 'server_error'}})}\n\n"
                    break
                if ev.reason == "abort":
                    break
                rest = detok.finish()
                yield chunk(rest, [], ev.reason, {"tokens_by_model": ev.written_by})
                if include_usage:
                    body = {"id": rid, "object": obj, "created": created, "model": self.name, "choices": [],
                            "usage": self._usage(len(ids), n_out, ev)}
                    yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.fe.abort(rid)  # the client went away (or we are done): no-op if ended
            await gen.aclose()


def build_app(make_runtime, served_name: str, tokenizer, max_tokens_limit: int | None = None,
              default_max_tokens: int = 16) -> FastAPI:
    """The FastAPI app. `make_runtime()` is an async context manager yielding a started
    `Frontend`; it runs in the server's event loop for the app's lifetime."""
    from contextlib import asynccontextmanager

    holder: dict[str, Server] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with make_runtime() as fe:
            holder["s"] = Server(fe, tokenizer, served_name, max_tokens_limit, default_max_tokens)
            yield
            holder.clear()

    app = FastAPI(title="tokenrouter", lifespan=lifespan)

    def server() -> Server:
        s = holder.get("s")
        if s is None or not s.fe.healthy:
            raise RuntimeUnavailable(s.fe.failure if s else "starting")
        return s

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") in ("json_invalid", "value_error.jsondecode"):
            return _error(400, f"the request body is not valid JSON: {first.get('msg')}")
        return _error(400, f"invalid request: {where or 'body'}: {first.get('msg', 'malformed')}", param=where or None)

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest):
        return _error(400, exc.message, param=exc.param)

    @app.exception_handler(RuntimeUnavailable)
    async def _unavailable(request: Request, exc: RuntimeUnavailable):
        return _error(503, f"the runtime is unavailable: {exc}", "server_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")

    @app.get("/health")
    async def health():
        s = holder.get("s")
        if s is None or not s.fe.healthy:
            return _error(503, s.fe.failure if s and s.fe.failure else "starting", "server_error")
        return {"status": "ok", "models": s.fe.writers}

    @app.get("/v1/models")
    async def models():
        s = server()
        return {"object": "list", "data": [{"id": s.name, "object": "model", "created": s.created,
                                            "owned_by": "tokenrouter", "writers": s.fe.writers,
                                            "max_model_len": s.fe.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        s = server()
        text = render(await s.fe.stats(), s.fe.frontend_stats())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        s = server()
        s.check_common(body)
        ids = s.prompt_ids(body.prompt)
        sampling = s.sampling(body, len(ids), body.max_tokens)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, sampling, body.seed or 0, False, body.stream, include)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        s = server()
        s.check_common(body)
        messages = []
        for m in body.messages:
            content = m.content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if p.get("type") == "text"]
                if len(parts) != len(content):
                    raise BadRequest("only text content parts are supported", "messages")
                content = "".join(parts)
            messages.append({"role": m.role, "content": content or ""})
        try:
            ids = s.tok.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as exc:
            raise BadRequest(f"cannot apply the chat template: {exc}", "messages") from None
        if isinstance(ids, str):
            ids = s.tok.encode(ids, add_special_tokens=False)
        if not ids:
            raise BadRequest("the conversation is empty", "messages")
        vocab = s.fe.vocab_size
        ids = list(ids)
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest("the chat template produced tokens outside the model's vocabulary", "messages")
        mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = s.sampling(body, len(ids), mt)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, sampling, body.seed or 0, True, body.stream, include)

    return app
