"""Running one admitted completion: its admission slot, the frontend's stream of tokens,
and the response, a JSON body or server-sent events.

Every response has `token_ids` in its choice and `tokens_by_model` (how many tokens each
model wrote; in the final chunk when streaming). A client that disconnects aborts its
request, which releases its KV everywhere; a request past its deadline ends with 504 (or
an `error` event of type `timeout` in a stream). A request that cannot complete because the
runtime is down (its deadline passed while a subserver restarted, or restarts are
exhausted) gets 503 naming the cause, with `Retry-After` (streams: an `error` event with
code `unavailable`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS, SamplingParams
from tokenrouter.runtime.frontend.frontend import Delta, Final, Frontend, RuntimeUnavailable
from tokenrouter.runtime.http.detokenizer import Detokenizer
from tokenrouter.runtime.http.limits import Admission, Limits
from tokenrouter.runtime.http.protocol import DeadlineExceeded, error_response
from tokenrouter.runtime.http.validation import Validator


class Server:
    """Holds what the endpoints share: the runtime frontend, the tokenizer, the checks and
    the limits; runs admitted requests."""

    def __init__(self, frontend: Frontend, tokenizer, served_name: str, max_tokens_limit: int | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, limits: Limits | None = None):
        self.fe = frontend
        self.tok = tokenizer
        self.name = served_name
        self.checks = Validator(frontend, tokenizer, served_name, max_tokens_limit, default_max_tokens)
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.created = int(time.time())

    def arrived(self) -> float | None:
        """The deadline of a request that arrives now (monotonic), if there is one."""
        t = self.limits.request_timeout_s
        return None if t is None else time.monotonic() + t


    # -------------------------------------------------------------- running
    async def run(self, request: Request, ids: list[int], params: SamplingParams, route_seed: int | None,
                  chat: bool, stream: bool, include_usage: bool, deadline: float | None = None):
        """Run one admitted request. `route_seed` seeds the program's coin flips (the body's
        `seed`); None: the frontend derives it from the request id."""
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        stop_ids = set(params.stop_token_ids)
        await self._admit(deadline)
        release = self.admission.release
        try:
            gen = self.fe.generate(ids, params, route_seed=route_seed, rid=rid)
            if stream:
                resp = AdmittedStream(self._stream(gen, rid, ids, stop_ids, chat, include_usage, deadline),
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
            if not self.fe.healthy:  # it waited for a subserver to come back: say which
                return self.unavailable(f"the request did not finish within {self.limits.request_timeout_s} s "
                                        f"while the runtime was unavailable: {self.fe.failure}")
            raise DeadlineExceeded(f"the request did not finish within {self.limits.request_timeout_s} s "
                                   f"({len(out)} tokens generated)") from None
        finally:
            watcher.cancel()
            self.fe.abort(rid)
            await gen.aclose()
        if final is None or final.reason == "abort":
            return error_response(499, "the request was aborted", "aborted")
        if final.reason == "unavailable":
            return self.unavailable(final.error or "the runtime stopped")
        if final.reason == "error":
            return error_response(500, f"the request failed: {final.error}", "server_error")
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

    def unavailable(self, why: str):
        """503 naming why the runtime cannot complete requests now, with `Retry-After`."""
        return error_response(503, f"the runtime is unavailable: {why}", "server_error", code="unavailable",
                              headers={"Retry-After": str(self.limits.outage_retry_after_s)})

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
                    err = {"message": msg, "type": "timeout"}
                    if not self.fe.healthy:
                        err = {"message": f"{msg} while the runtime was unavailable: {self.fe.failure}",
                               "type": "server_error", "code": "unavailable"}
                    yield f"data: {json.dumps({'error': err})}\n\n"
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
                if ev.reason == "unavailable":
                    err = {"message": f"the runtime is unavailable: {ev.error}", "type": "server_error",
                           "code": "unavailable"}
                    yield f"data: {json.dumps({'error': err})}\n\n"
                    break
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


class AdmittedStream(StreamingResponse):
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

