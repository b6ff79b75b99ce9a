"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, health, metrics.

The app only translates: it validates a request (HTTP 400 with an OpenAI-style error body
for anything malformed, so a bad client never costs a traceback or the server), turns it
into token ids, and streams what `Frontend.generate` yields back as JSON or server-sent
events. A client that disconnects aborts its request, which releases its KV everywhere.

Extensions to the OpenAI schema: `top_k`, `stop_token_ids`, `ignore_eos` in requests;
`token_ids` in each choice and `tokens_by_model` (how many tokens each model wrote) in
every response (in the final chunk when streaming).

Load is bounded (`Limits`): a body over `max_body_bytes` gets 413 before it is parsed,
tokenisation and chat templates run in worker threads (the event loop keeps answering
/health), at most `max_running` requests run and `max_queue` more wait in FIFO order
(beyond that: 503 with `Retry-After`), an optional deadline ends a request that runs too
long (504), and with an `api_key` every /v1 endpoint wants `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import time
import uuid
from dataclasses import dataclass
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


class Overloaded(Exception):
    """Every admission slot is taken and the wait queue is full."""


class DeadlineExceeded(Exception):
    pass


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
           headers: dict[str, str] | None = None, code: str | None = None):
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _error_body(status: int, message: str, type_: str, code: str | None = None) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": message, "type": type_, "param": None,
                                         "code": code}}).encode()


@dataclass
class Limits:
    """What bounds the HTTP side (see `tokenrouter serve --help`)."""

    max_body_bytes: int = 8 << 20
    max_running: int = 64  # requests generating at once
    max_queue: int = 256  # requests waiting for a slot beyond those
    request_timeout_s: float | None = None  # whole request, queueing included
    retry_after_s: int = 1
    api_key: str | None = None


class Guard:
    """Pure ASGI middleware, outermost: the bearer token for /v1, then the body limit
    (Content-Length first; a chunked body is counted while read, before any parsing),
    then the app gets the buffered body."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        lim = self.limits
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        if lim.api_key is not None and scope.get("path", "").startswith("/v1"):
            got = headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {lim.api_key}".encode()):
                return await self._reply(send, *_error_body(
                    401, "a valid API key is required (Authorization: Bearer KEY)",
                    "invalid_request_error", "invalid_api_key"))
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = _error_body(413, f"the request body is over the {lim.max_body_bytes}-byte limit",
                              "invalid_request_error", "request_too_large")
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            return await self._reply(send, *_error_body(400, "bad Content-Length", "invalid_request_error"))
        if declared > lim.max_body_bytes:
            return await self._reply(send, *too_big)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > lim.max_body_bytes:
                return await self._reply(send, *too_big)
            chunks.append(body)
            if not msg.get("more_body"):
                break
        whole = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class Admission:
    """At most `max_running` requests at once; up to `max_queue` more wait in FIFO order.
    A slot passes directly from a finishing request to the oldest waiter."""

    def __init__(self, limits: Limits):
        self.limits = limits  # read on every request, so a running server can be retuned
        self.running = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.refused = 0

    async def acquire(self, timeout: float | None = None) -> None:
        if self.running < self.limits.max_running and not self.waiters:
            self.running += 1
            return
        if len(self.waiters) >= self.limits.max_queue:
            self.refused += 1
            raise Overloaded()
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot arrived as we gave up: pass it on
            else:
                fut.cancel()
                try:
                    self.waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot goes to the oldest waiter
                return
        self.running -= 1


def _check_text(text: str, param: str) -> str:
    """Refuse a string that is not valid Unicode (a lone surrogate such as "\\ud800" is
    valid JSON but has no UTF-8 form, so no tokenizer can read it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{param} is not valid Unicode: {exc.reason} at position {exc.start}", param) from None
    return text


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=(1 << 31) - 1)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=1024)
    ignore_eos: bool = False
    n: int = 1
    logprobs: Any = None
    echo: bool = False
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # not supported: refused with a 400 rather than silently ignored
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logit_bias: Any = None


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
                 default_max_tokens: int = 16, limits: Limits | None = None):
        self.fe = frontend
        self.tok = tokenizer
        self.name = served_name
        self.max_tokens_limit = max_tokens_limit
        self.default_max_tokens = default_max_tokens
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.created = int(time.time())
        self.token_bytes = _longest_token_bytes(tokenizer)

    def arrived(self) -> float | None:
        """The deadline of a request that arrives now (monotonic), if there is one."""
        t = self.limits.request_timeout_s
        return None if t is None else time.monotonic() + t

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
            ids = await self.encode(_check_text(prompt, "prompt"))
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
                  stream: bool, include_usage: bool, deadline: float | None = None):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        stop_ids = set(sampling["stop_token_ids"])
        await self._admit(deadline)
        release = self.admission.release
        try:
            gen = self.fe.generate(ids, sampling, seed=seed, rid=rid)
            if stream:
                resp = _Stream(self._stream(gen, rid, ids, stop_ids, chat, include_usage, deadline),
                               media_type="text/event-stream")
                resp.on_close, release = self.admission.release, None  # released when the stream ends
                return resp
            return await self._complete(request, gen, rid, ids, stop_ids, chat, deadline)
        finally:
            if release is not None:
                release()

    async def _admit(self, deadline: float | None) -> None:
        try:
            await self.admission.acquire(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("the request waited for a slot until its deadline") from None

    async def _complete(self, request: Request, gen, rid: str, ids: list[int], stop_ids: set[int], chat: bool,
                        deadline: float | None):
        watcher = asyncio.create_task(self._watch_disconnect(request, rid))
        out: list[int] = []
        writers: list[str] = []
        final: Final | None = None
        try:
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                async for ev in gen:
                    if isinstance(ev, Delta):
                        out += ev.tokens
                        writers += ev.writers
                    else:
                        final = ev
        except TimeoutError:
            raise DeadlineExceeded(f"the request did not finish within {self.limits.request_timeout_s} s "
                                   f"({len(out)} tokens generated)") from None
        finally:
            watcher.cancel()
            self.fe.abort(rid)
            await gen.aclose()
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

    async def _stream(self, gen, rid: str, ids: list[int], stop_ids: set[int], chat: bool, include_usage: bool,
                      deadline: float | None = None):
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
            while True:
                try:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    ev = await asyncio.wait_for(gen.__anext__(), left)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    msg = f"the request did not finish within {self.limits.request_timeout_s} s"
                    yield f"data: {json.dumps({'error': {'message': msg, 'type': 'timeout'}})}\n\n"
                    break
                except (RuntimeUnavailable, ValueError) as exc:  # the headers are sent: say it in the stream
                    msg = f"the request failed: {exc}"
                    yield f"data: {json.dumps({'error': {'message': msg, 'type': 'server_error'}})}\n\n"
                    break
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


class _Stream(StreamingResponse):
    """A streaming response that gives its admission slot back however it ends (also when
    the client left before the first byte, so the body generator never started)."""

    on_close = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()
                self.on_close = None


def _longest_token_bytes(tokenizer) -> int | None:
    """The most UTF-8 bytes one token decodes to (for the cheap too-long check)."""
    try:
        n = int(tokenizer.vocab_size)
        return max(len(tokenizer.decode([i]).encode("utf-8", "replace")) for i in range(n)) or None
    except Exception:
        return None


def build_app(make_runtime, served_name: str, tokenizer, max_tokens_limit: int | None = None,
              default_max_tokens: int = 16, limits: Limits | None = None) -> FastAPI:
    """The FastAPI app. `make_runtime()` is an async context manager yielding a started
    `Frontend`; it runs in the server's event loop for the app's lifetime."""
    from contextlib import asynccontextmanager

    holder: dict[str, Server] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with make_runtime() as fe:
            holder["s"] = Server(fe, tokenizer, served_name, max_tokens_limit, default_max_tokens, limits)
            yield
            holder.clear()

    limits = limits or Limits()
    app = FastAPI(title="tokenrouter", lifespan=lifespan)
    app.add_middleware(Guard, limits=limits)

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

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded):
        lim = limits or Limits()
        return _error(503, f"the server is at capacity ({lim.max_running} running, {lim.max_queue} waiting); "
                           f"retry later", "server_error", headers={"Retry-After": str(lim.retry_after_s)},
                      code="overloaded")

    @app.exception_handler(DeadlineExceeded)
    async def _late(request: Request, exc: DeadlineExceeded):
        return _error(504, str(exc), "timeout", code="deadline_exceeded")

    @app.exception_handler(RuntimeUnavailable)
    async def _unavailable(request: Request, exc: RuntimeUnavailable):
        return _error(503, f"the runtime is unavailable: {exc}", "server_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")

    @app.get("/health")
    async def health():
        s = holder.get("s")
        if s is None:
            return _error(503, "starting", "server_error")
        body = {"status": "ok" if s.fe.healthy else "unavailable", "models": s.fe.writers,
                "subservers": s.fe.health()}
        if not s.fe.healthy:
            body["error"] = {"message": s.fe.failure or "starting", "type": "server_error", "param": None,
                             "code": None}
            return JSONResponse(body, status_code=503)
        return body

    @app.get("/v1/models")
    async def models():
        s = server()
        return {"object": "list", "data": [{"id": s.name, "object": "model", "created": s.created,
                                            "owned_by": "tokenrouter", "writers": s.fe.writers,
                                            "max_model_len": s.fe.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        """Answers whatever the state: a down subserver shows as up 0 (and is not asked)."""
        s = holder.get("s")
        if s is None:
            raise RuntimeUnavailable("starting")
        fs = s.fe.frontend_stats()
        fs["http"] = {"running": s.admission.running, "waiting": len(s.admission.waiters),
                      "refused": s.admission.refused}
        text = render(await s.fe.stats(timeout=2.0), fs)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        s = server()
        deadline = s.arrived()
        s.check_common(body)
        ids = await s.prompt_ids(body.prompt)
        sampling = s.sampling(body, len(ids), body.max_tokens)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, sampling, body.seed or 0, False, body.stream, include, deadline)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        s = server()
        deadline = s.arrived()
        s.check_common(body)
        messages = []
        for m in body.messages:
            content = m.content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if p.get("type") == "text"]
                if len(parts) != len(content):
                    raise BadRequest("only text content parts are supported", "messages")
                content = "".join(parts)
            messages.append({"role": m.role, "content": _check_text(content or "", "messages")})
        try:
            ids = await asyncio.to_thread(s.tok.apply_chat_template, messages, add_generation_prompt=True)
        except Exception as exc:
            raise BadRequest(f"cannot apply the chat template: {exc}", "messages") from None
        if isinstance(ids, str):
            ids = await s.encode(ids, add_special_tokens=False)
        if not ids:
            raise BadRequest("the conversation is empty", "messages")
        vocab = s.fe.vocab_size
        ids = list(ids)
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest("the chat template produced tokens outside the model's vocabulary", "messages")
        mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = s.sampling(body, len(ids), mt)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, sampling, body.seed or 0, True, body.stream, include, deadline)

    return app
