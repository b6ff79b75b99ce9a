"""What bounds the HTTP side: the body size, the API key, and how many requests run or wait.

`Guard` is pure ASGI middleware, outermost: it checks the bearer token for /v1 and the routes served without it (the model
list stays public, as /health does) and the body limit before anything is parsed; a body
over the limit is read to its end (and dropped) before the 413, so the client, still
sending, gets the answer rather than a reset connection. `Admission` lets at most
`max_running` requests run and `max_queue` more wait in FIFO order; beyond that a request
gets 503 with `Retry-After`, so overload is shed at the door instead of growing every
admitted request's latency. The default queue is `QUEUE_PER_RUNNING` times `max_running`: a
request admitted behind a full queue waits about that many times a request's own run before
it starts. Connections below the app are bounded in `connections.py` (`Limits.connections`).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
from dataclasses import dataclass, field

from tokenrouter.runtime.http.connections import ConnectionLimits
from tokenrouter.runtime.http.schema import Overloaded, error_body

QUEUE_PER_RUNNING = 0.5  # the default --max-queue, as a multiple of --max-running


@dataclass
class Limits:
    """What bounds the HTTP side (see `tokenrouter serve --help`)."""

    max_body_bytes: int = 8 << 20
    max_running: int = 64  # requests generating at once
    max_queue: int = int(64 * QUEUE_PER_RUNNING)  # requests waiting for a slot beyond those
    request_timeout_s: float | None = None  # whole request, queueing included
    retry_after_s: int = 1  # Retry-After of a 503 at capacity
    outage_retry_after_s: int = 5  # Retry-After of a 503 while a subserver is down (a restart takes seconds)
    api_key: str | None = None
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


DRAIN_FACTOR = 16  # a body over the limit is read (and dropped) up to this many times the limit


def _guarded(path: str) -> bool:
    """Whether `path` wants the API key: /v1, the completion routes without it and the
    tokenizer's routes, except the model list (public, as in llama-server)."""
    bare = path[len("/v1"):] if path.startswith("/v1/") else path
    if bare == "/models" or bare.startswith("/models/"):
        return False
    return path.startswith(("/v1", "/completions", "/chat/completions", "/tokenize", "/detokenize"))


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
        if lim.api_key is not None and _guarded(scope.get("path", "")):
            got = headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {lim.api_key}".encode()):
                return await self._reply(send, *error_body(
                    401, "a valid API key is required (Authorization: Bearer KEY)",
                    "invalid_request_error", "invalid_api_key"))
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = error_body(413, f"the request body is over the {lim.max_body_bytes}-byte limit",
                              "invalid_request_error", "request_too_large")
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            return await self._reply(send, *error_body(400, "bad Content-Length", "invalid_request_error"))
        if declared > lim.max_body_bytes:
            return await self._refuse(receive, send, too_big)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > lim.max_body_bytes:
                return await self._refuse(receive, send, too_big, msg.get("more_body", False))
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

    async def _refuse(self, receive, send, reply: tuple[int, bytes], more: bool = True) -> None:
        """Drop the rest of the body (at most `DRAIN_FACTOR` times the limit), then reply."""
        left = DRAIN_FACTOR * self.limits.max_body_bytes
        while more and left > 0:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            left -= len(msg.get("body", b""))
            more = msg.get("more_body", False)
        await self._reply(send, *reply)

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

