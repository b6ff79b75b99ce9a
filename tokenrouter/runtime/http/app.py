"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, tokenize, detokenize,
health, metrics.

The app only translates: it validates a request (`validation.py`; HTTP 400 with an
OpenAI-style error body for anything malformed, so a bad client never costs a traceback
or the server), turns it into token ids and its `SamplingParams`, and returns what
`Frontend.generate` yields as JSON or server-sent events (`completions.py`). The request
bodies and error bodies are `schema.py`; `limits.py` bounds the load. A body's `seed`
seeds both the sampler and the program's coin flips (the route seed); a request without
one gets a route seed of its own from its request id.

Load is bounded (`Limits`): a body over `max_body_bytes` gets 413 before it is parsed,
tokenisation and chat templates run in worker threads (the event loop keeps answering
/health), at most `max_running` requests run and `max_queue` more wait in FIFO order
(beyond that: 503 with `Retry-After`), an optional deadline ends a request that runs too
long (504), and with an `api_key` every /v1 endpoint but the model list, the completion
routes without `/v1`, /tokenize and /detokenize want `Authorization: Bearer KEY` (/health,
/version, /metrics and the model list stay open). The completion routes and the model list
are served with and without `/v1` (llama-server's paths). The program is served under one
or more names (`names`; the first is the one responses carry unless a request names
another). CORS is off unless `allowed_origins` names origins. FastAPI's /docs, /redoc and
/openapi.json are off.

`build_app` puts the app together from its parts: the lifespan that runs the runtime
(`Holder`), the error handlers, the status routes (health, models, metrics), the
tokenizer routes and the completion routes.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import tokenrouter
from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS
from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
from tokenrouter.runtime.http import fields
from tokenrouter.runtime.http.choices import expand
from tokenrouter.runtime.http.completions import Server
from tokenrouter.runtime.http.connections import ConnectionStats
from tokenrouter.runtime.http.limits import Guard, Limits
from tokenrouter.runtime.http.schema import (BadRequest, ChatRequest, CompletionRequest, DeadlineExceeded,
                                               DetokenizeRequest, Overloaded, Reply, TokenizeRequest, error_response)
from tokenrouter.runtime.http.tool_parsers import choose
from tokenrouter.runtime.http.tools import ToolUse, forced_calls, template_tools, tool_use
from tokenrouter.runtime.http.validation import chat_logprobs, completion_logprobs, template_variables
from tokenrouter.runtime.metrics import CONTENT_TYPE, render

__all__ = ["Holder", "Limits", "Server", "build_app"]


class Holder:
    """The app's `Server` while the runtime runs (set by the lifespan)."""

    def __init__(self):
        self.server: Server | None = None

    def serving(self) -> Server:
        """The server, if it can take requests now; else RuntimeUnavailable (503)."""
        s = self.server
        if s is None or not s.fe.healthy:
            raise RuntimeUnavailable(s.fe.failure if s else "starting")
        return s


def build_app(make_runtime, served_name: str | Sequence[str], tokenizer, max_tokens_limit: int | None = None,
              default_max_tokens: int = DEFAULT_MAX_TOKENS, limits: Limits | None = None,
              allowed_origins: Sequence[str] = (), tool_call_parser: str | None = None) -> FastAPI:
    """The FastAPI app. `make_runtime()` is an async context manager yielding a started
    `Frontend`; it runs in the server's event loop for the app's lifetime. `served_name`:
    the model id, or several (vLLM's `--served-model-name a b`). `tool_call_parser`: the
    name of the parser that reads tool calls (`tool_parsers.PARSERS`; None: the one the
    chat template's format picks); an unknown name is a ValueError."""
    limits = limits or Limits()
    parser = choose(tokenizer.chat_template, tool_call_parser)
    holder = Holder()
    names = (served_name,) if isinstance(served_name, str) else tuple(served_name)
    if not names:
        raise ValueError("build_app: at least one served name")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with make_runtime() as fe:
            holder.server = Server(fe, tokenizer, names, max_tokens_limit, default_max_tokens, limits, parser)
            yield
            holder.server = None

    # no /docs, /redoc or /openapi.json: the API is OpenAI's (docs/runtime.md), and the schema
    # FastAPI would derive lists only the fields this server implements, not those it accepts
    app = FastAPI(title="tokenrouter", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.connections = ConnectionStats()  # counted by the connection guard (`connections.py`)
    app.add_middleware(Guard, limits=limits)
    if allowed_origins:  # outermost: a preflight is answered before the API key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])
    add_error_handlers(app, limits)
    add_status_routes(app, holder, names)
    add_token_routes(app, holder)
    add_completion_routes(app, holder)
    return app


def add_error_handlers(app: FastAPI, limits: Limits) -> None:
    """Every error as OpenAI's body: 400, 503 (with `Retry-After` when at capacity), 504."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") in ("json_invalid", "value_error.jsondecode"):
            return error_response(400, f"the request body is not valid JSON: {first.get('msg')}")
        return error_response(400, f"invalid request: {where or 'body'}: {first.get('msg', 'malformed')}",
                              param=where or None)

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest):
        return error_response(400, exc.message, param=exc.param)

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded):
        return error_response(503, f"the server is at capacity ({limits.max_running} running, "
                                   f"{limits.max_queue} waiting); retry later", "server_error",
                              headers={"Retry-After": str(limits.retry_after_s)}, code="overloaded")

    @app.exception_handler(DeadlineExceeded)
    async def _late(request: Request, exc: DeadlineExceeded):
        return error_response(504, str(exc), "timeout", code="deadline_exceeded")

    @app.exception_handler(RuntimeUnavailable)
    async def _unavailable(request: Request, exc: RuntimeUnavailable):
        return error_response(503, f"the runtime is unavailable: {exc}", "server_error", code="unavailable",
                              headers={"Retry-After": str(limits.outage_retry_after_s)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail),
                              "invalid_request_error" if exc.status_code < 500 else "server_error")


def add_status_routes(app: FastAPI, holder: Holder, names: tuple[str, ...]) -> None:
    """GET /health, /version, /v1/models, /v1/models/{id} (both also without `/v1`) and /metrics."""

    @app.get("/health")
    async def health():
        s = holder.server
        retry = {"Retry-After": str(s.limits.outage_retry_after_s if s else 5)}
        if s is None:
            return error_response(503, "starting", "server_error", headers=retry)
        body = {"status": "ok" if s.fe.healthy else "unavailable", "models": s.fe.writers,
                "subservers": s.fe.health()}
        if not s.fe.healthy:
            body["error"] = {"message": s.fe.failure or "starting", "type": "server_error", "param": None,
                             "code": None}
            return JSONResponse(body, status_code=503, headers=retry)
        return body

    @app.get("/version")
    async def version():
        return {"version": tokenrouter.__version__}

    def card(s: Server, name: str) -> dict:
        return {"id": name, "object": "model", "created": s.created, "owned_by": "tokenrouter", "root": names[0],
                "writers": s.fe.writers, "max_model_len": s.fe.max_model_len}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        s = holder.serving()
        return {"object": "list", "data": [card(s, n) for n in names]}

    @app.get("/v1/models/{model_id:path}")
    @app.get("/models/{model_id:path}")
    async def model(model_id: str):
        s = holder.serving()
        if model_id not in names:
            return error_response(404, f"model {model_id!r} is not served here", param="model",
                                  code="model_not_found")
        return card(s, model_id)

    @app.get("/metrics")
    async def metrics():
        """Answers whatever the state: a down subserver shows as up 0 (and is not asked)."""
        s = holder.server
        if s is None:
            raise RuntimeUnavailable("starting")
        fs = s.fe.frontend_stats()
        conns = app.state.connections
        fs["http"] = {"running": s.admission.running, "waiting": len(s.admission.waiters),
                      "refused": s.admission.refused, "connections_open": conns.open,
                      "connections_closed": dict(conns.closed)}
        text = render(await s.fe.stats(timeout=2.0), fs, s.fe.metrics)
        return Response(text, media_type=CONTENT_TYPE)


def add_token_routes(app: FastAPI, holder: Holder) -> None:
    """POST /tokenize and /detokenize (vLLM's), so a client can count and inspect tokens."""

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        s = holder.serving()
        s.checks.check_model(body.model)
        fields.check(body)
        if (body.prompt is None) == (body.messages is None):
            raise BadRequest("give prompt or messages", "prompt")
        special = body.add_special_tokens
        if body.messages is not None:
            _, ids = await s.checks.chat_prompt(body.messages, body.add_generation_prompt, bool(special),
                                                template_variables(body.chat_template_kwargs,
                                                                   tools=template_tools(body.tools)))
        else:
            ids = await s.checks.encode(body.prompt, add_special_tokens=special is not False)
        out = {"tokens": ids, "count": len(ids), "max_model_len": s.fe.max_model_len}
        if body.return_token_strs:
            out["token_strs"] = [s.tok.id_to_token(t) for t in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        s = holder.serving()
        s.checks.check_model(body.model)
        fields.check(body)
        vocab = s.fe.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "tokens")
        return {"prompt": await asyncio.to_thread(s.tok.decode, body.tokens)}


def add_completion_routes(app: FastAPI, holder: Holder) -> None:
    """POST /v1/completions and /v1/chat/completions, also without `/v1` (as llama-server
    serves them, for clients whose base URL lacks it)."""

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(body: CompletionRequest, request: Request):
        s = holder.serving()
        deadline = s.arrived()
        s.checks.check_common(body)
        k = completion_logprobs(body)
        prompts = await s.checks.prompts(body)
        params = await s.checks.sampling(body, k)
        choices = []
        for i, ids in enumerate(prompts):
            echo = await asyncio.to_thread(s.tok.decode, ids) if body.echo else ""
            mt = s.checks.max_tokens(len(ids), body.max_tokens, body.min_tokens)
            choices += expand(body, i, ids, params.replace(max_tokens=mt), len(choices), echo)
        return await s.run(request, choices, reply(body, request, chat=False), deadline)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        s = holder.serving()
        deadline = s.arrived()
        s.checks.check_common(body)
        if body.echo:
            raise BadRequest("echo is not supported for chat", "echo")
        k = chat_logprobs(body)
        use = tool_use(body, s.tool_parser)
        text, ids = await s.checks.chat_prompt(body.messages, body.add_generation_prompt, body.add_special_tokens,
                                               template_variables(body.chat_template_kwargs, body.documents,
                                                                  body.reasoning_effort, template_tools(body.tools)))
        mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        forced = forced_calls(use, body.tools, s.tok.token_to_id)
        params = (await s.checks.sampling(body, k, forced)).replace(
            max_tokens=s.checks.max_tokens(len(ids), mt, body.min_tokens))
        return await s.run(request, expand(body, 0, ids, params, 0),
                           reply(body, request, chat=True, prompt_text=text if body.return_prompt_text else None,
                                 tools=use), deadline)


def reply(body, request: Request, chat: bool, prompt_text: str | None = None, tools: ToolUse | None = None) -> Reply:
    """How the response to `body` is shaped. The X-Request-Id header names the request before
    its `request_id` field (as in vLLM)."""
    return Reply(chat=chat, model=body.model, stream=bool(body.stream),
                 include_usage=bool(body.stream_options and body.stream_options.include_usage),
                 skip_special_tokens=body.skip_special_tokens,
                 request_id=request.headers.get("x-request-id") or body.request_id,
                 prompt_token_ids=bool(body.return_token_ids), prompt_text=prompt_text,
                 tokens_as_ids=bool(body.return_tokens_as_token_ids), tools=tools)
