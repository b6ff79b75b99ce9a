"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, health, metrics.

The app only translates: it validates a request (`validation.py`; HTTP 400 with an
OpenAI-style error body for anything malformed, so a bad client never costs a traceback
or the server), turns it into token ids and its `SamplingParams`, and returns what
`Frontend.generate` yields as JSON or server-sent events (`completions.py`). The request
bodies and error bodies are `protocol.py`; `limits.py` bounds the load. A body's `seed`
seeds both the sampler and the program's coin flips (the route seed); a request without
one gets a route seed of its own from its request id.

Load is bounded (`Limits`): a body over `max_body_bytes` gets 413 before it is parsed,
tokenisation and chat templates run in worker threads (the event loop keeps answering
/health), at most `max_running` requests run and `max_queue` more wait in FIFO order
(beyond that: 503 with `Retry-After`), an optional deadline ends a request that runs too
long (504), and with an `api_key` every /v1 endpoint wants `Authorization: Bearer KEY`.

`build_app` puts the app together from its parts: the lifespan that runs the runtime
(`Holder`), the error handlers, the status routes (health, models, metrics) and the
completion routes.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS
from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
from tokenrouter.runtime.http.completions import Server
from tokenrouter.runtime.http.connections import ConnectionStats
from tokenrouter.runtime.http.limits import Guard, Limits
from tokenrouter.runtime.http.protocol import (BadRequest, ChatRequest, CompletionRequest, DeadlineExceeded,
                                               Overloaded, error_response)
from tokenrouter.runtime.metrics import render

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


def build_app(make_runtime, served_name: str, tokenizer, max_tokens_limit: int | None = None,
              default_max_tokens: int = DEFAULT_MAX_TOKENS, limits: Limits | None = None) -> FastAPI:
    """The FastAPI app. `make_runtime()` is an async context manager yielding a started
    `Frontend`; it runs in the server's event loop for the app's lifetime."""
    limits = limits or Limits()
    holder = Holder()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with make_runtime() as fe:
            holder.server = Server(fe, tokenizer, served_name, max_tokens_limit, default_max_tokens, limits)
            yield
            holder.server = None

    app = FastAPI(title="tokenrouter", lifespan=lifespan)
    app.state.connections = ConnectionStats()  # counted by the connection guard (`connections.py`)
    app.add_middleware(Guard, limits=limits)
    add_error_handlers(app, limits)
    add_status_routes(app, holder)
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


def add_status_routes(app: FastAPI, holder: Holder) -> None:
    """GET /health, /v1/models and /metrics."""

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

    @app.get("/v1/models")
    async def models():
        s = holder.serving()
        return {"object": "list", "data": [{"id": s.name, "object": "model", "created": s.created,
                                            "owned_by": "tokenrouter", "writers": s.fe.writers,
                                            "max_model_len": s.fe.max_model_len}]}

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
        text = render(await s.fe.stats(timeout=2.0), fs)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def add_completion_routes(app: FastAPI, holder: Holder) -> None:
    """POST /v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        s = holder.serving()
        deadline = s.arrived()
        s.checks.check_common(body)
        ids = await s.checks.prompt_ids(body.prompt)
        params = s.checks.sampling(body, len(ids), body.max_tokens)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, params, body.seed, False, body.stream, include, deadline)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        s = holder.serving()
        deadline = s.arrived()
        s.checks.check_common(body)
        ids = await s.checks.chat_ids(body)
        mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = s.checks.sampling(body, len(ids), mt)
        include = bool((body.stream_options or {}).get("include_usage"))
        return await s.run(request, ids, params, body.seed, True, body.stream, include, deadline)
