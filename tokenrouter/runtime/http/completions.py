"""Running one admitted completion: its admission slot, the frontend's streams of tokens
(one per choice), and the response, a JSON body or server-sent events.

A request's choices (`choices.py`: `n`, a list of prompts) run as independent requests.

Every choice has `token_ids` and `token_writers` (the writer of each token) and every
response `tokens_by_model` (how many tokens each model wrote; in the final chunk when
streaming). What else the request asked to get back is its `Reply` (`schema.py`): the
response id's tail (the client's request id), the prompt's token ids and rendered text (in
the first chunk of each choice when streaming), logprob tokens named by id, tool calls read
from the text (`tool_output.py`: `message.tool_calls`, streamed as `delta.tool_calls`). The
text comes from the frontend (`frontend/text.py`), which withholds stop strings. A client that
disconnects aborts its requests, which releases their KV everywhere; a request past its
deadline ends with 504 (or an `error` event of type `timeout` in a stream). A request that
cannot complete because the runtime is down (its deadline passed while a subserver
restarted, or restarts are exhausted) gets 503 naming the cause, with `Retry-After`
(streams: an `error` event with code `unavailable`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS
from tokenrouter.runtime.frontend.frontend import Delta, Final, Frontend, RuntimeUnavailable
from tokenrouter.runtime.http.choices import Choice
from tokenrouter.runtime.http.limits import Admission, Limits
from tokenrouter.runtime.http.schema import DeadlineExceeded, Reply, error_response
from tokenrouter.runtime.http.tool_output import ToolReply
from tokenrouter.runtime.http.tool_parsers import ToolParser, choose
from tokenrouter.runtime.http.validation import Validator

@dataclass
class Outcome:
    """What a choice produced."""

    tokens: list[int] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    text: str = ""
    final: Final | None = None


class Server:
    """Holds what the endpoints share: the runtime frontend, the tokenizer, the checks, the
    limits and the tool-call parser; runs admitted requests."""

    def __init__(self, frontend: Frontend, tokenizer, names: tuple[str, ...], max_tokens_limit: int | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, limits: Limits | None = None,
                 tool_parser: ToolParser | None = None):
        self.fe = frontend
        self.tool_parser = tool_parser or choose(tokenizer.chat_template)
        self.tok = tokenizer
        self.names = tuple(names)
        self.name = self.names[0]
        self.checks = Validator(frontend, tokenizer, self.names, max_tokens_limit, default_max_tokens)
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.created = int(time.time())

    def unavailable(self, why: str):
        """503 naming why the runtime cannot complete requests now, with `Retry-After`."""
        return error_response(503, f"the runtime is unavailable: {why}", "server_error", code="unavailable",
                              headers={"Retry-After": str(self.limits.outage_retry_after_s)})

    def arrived(self) -> float | None:
        """The deadline of a request that arrives now (monotonic), if there is one."""
        t = self.limits.request_timeout_s
        return None if t is None else time.monotonic() + t

    # -------------------------------------------------------------- running
    async def run(self, request: Request, choices: list[Choice], reply: Reply, deadline: float | None = None):
        """Run one admitted request's choices."""
        run = Run(self, choices, reply)
        await self._admit(deadline)
        release = self.admission.release
        try:
            if reply.stream:
                resp = AdmittedStream(run.stream(deadline), media_type="text/event-stream")
                resp.on_close, release = self.admission.release, None  # released when the stream ends
                return resp
            return await run.complete(request, deadline)
        finally:
            if release is not None:
                release()

    async def _admit(self, deadline: float | None) -> None:
        try:
            await self.admission.acquire(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded("the request waited for a slot until its deadline") from None


class Run:
    """One HTTP request's choices on the frontend, and their response. The frontend's request
    ids are the server's own, unique; the response's `id` ends with the client's request id
    when it gave one (as vLLM's does)."""

    def __init__(self, server: Server, choices: list[Choice], reply: Reply):
        self.s, self.choices, self.reply, self.chat = server, choices, reply, reply.chat
        self.model = reply.model or server.name
        prefix, rid = "chatcmpl-" if self.chat else "cmpl-", uuid.uuid4().hex
        self.id = prefix + (rid if reply.request_id is None else reply.request_id)
        self.rids = [prefix + rid if len(choices) == 1 else f"{prefix}{rid}-{c.index}" for c in choices]
        first = {}  # prompt index -> its first choice's id: the others fork its prompt's KV (`choices.py`)
        for c, r in zip(choices, self.rids):
            first.setdefault(c.prompt_index, r)
        self.gens = [server.fe.generate(c.prompt, c.params, route_seed=c.route_seed, rid=r, tokenizer=server.tok,
                                        skip_special_tokens=reply.skip_special_tokens,
                                        fork_of=None if first[c.prompt_index] == r else first[c.prompt_index])
                     for c, r in zip(choices, self.rids)]
        self.created = int(time.time())
        self.opened: set[int] = set()  # the choices whose first chunk is sent
        self.tool_replies = {c.index: ToolReply(reply.tools) for c in choices} if reply.tools else {}

    def abort(self) -> None:
        for r in self.rids:
            self.s.fe.abort(r)

    async def close(self) -> None:
        self.abort()  # no-op for ended requests
        for g in self.gens:
            await g.aclose()

    # ------------------------------------------------------------- JSON body
    async def complete(self, request: Request, deadline: float | None):
        watcher = asyncio.create_task(self._watch_disconnect(request))
        outs = [Outcome() for _ in self.choices]

        async def collect(gen, out: Outcome) -> None:
            async for ev in gen:
                if isinstance(ev, Delta):
                    out.tokens += ev.tokens
                    out.writers += ev.writers
                    out.logprobs += ev.logprobs
                    out.text += ev.text
                else:
                    out.final = ev
                    out.text += ev.text
                    if ev.reason in ("error", "abort", "unavailable"):
                        self.abort()  # one choice failed: the others end too
        try:
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await asyncio.gather(*(collect(g, o) for g, o in zip(self.gens, outs)))
        except TimeoutError:
            n = sum(len(o.tokens) for o in outs)
            if not self.s.fe.healthy:  # it waited for a subserver to come back: say which
                return self.s.unavailable(f"the request did not finish within {self.s.limits.request_timeout_s} s "
                                          f"while the runtime was unavailable: {self.s.fe.failure}")
            raise DeadlineExceeded(f"the request did not finish within {self.s.limits.request_timeout_s} s "
                                   f"({n} tokens generated)") from None
        finally:
            watcher.cancel()
            await self.close()
        gone = next((o.final for o in outs if o.final is not None and o.final.reason == "unavailable"), None)
        if gone is not None:
            return self.s.unavailable(gone.error or "the runtime stopped")
        failed = next((o.final for o in outs if o.final is not None and o.final.reason == "error"), None)
        if failed is not None:
            return error_response(500, f"the request failed: {failed.error}", "server_error")
        if any(o.final is None or o.final.reason == "abort" for o in outs):
            return error_response(499, "the request was aborted", "aborted")
        body = {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model,
                "choices": [self._choice(c, o) for c, o in zip(self.choices, outs)],
                "usage": self._usage([len(o.tokens) for o in outs], [o.final for o in outs])}
        body["tokens_by_model"] = body["usage"]["tokens_by_model"]
        if self.chat:
            body.update(self._prompt(self.choices[0]))
        return JSONResponse(body)

    def _prompt(self, c: Choice) -> dict[str, Any]:
        """What the request asked to get back of choice c's prompt (chat: in the response;
        completions: in the choice; a stream: in the choice's first chunk)."""
        out: dict[str, Any] = {}
        if self.reply.prompt_token_ids:
            out["prompt_token_ids"] = c.prompt
        if self.reply.prompt_text is not None:
            out["prompt_text"] = self.reply.prompt_text
        return out

    def _choice(self, c: Choice, o: Outcome) -> dict[str, Any]:
        final = o.final
        out: dict[str, Any] = {"index": c.index, "finish_reason": final.reason,
                               "stop_reason": stop_reason(final, o.tokens, c.stop_ids),
                               "token_ids": o.tokens, "token_writers": o.writers}
        lp = self._logprobs(o.tokens, o.writers, o.logprobs, c.params.logprobs)
        tools = self.tool_replies.get(c.index)
        if tools is not None:
            out.update(message=tools.message(o.text), finish_reason=tools.finish_reason(final.reason))
        if self.chat:
            out.setdefault("message", {"role": "assistant", "content": o.text})
            out["logprobs"] = lp
        else:
            out.update(text=c.echo + o.text, logprobs=lp, **self._prompt(c))
        return out

    def _usage(self, n_out: list[int], finals: list[Final | None]) -> dict[str, Any]:
        prompts = {c.prompt_index: len(c.prompt) for c in self.choices}  # once, however many choices
        p = sum(prompts.values())
        by: dict[str, int] = {}
        for f in finals:
            for w, k in (f.written_by if f else {}).items():
                by[w] = by.get(w, 0) + k
        return {"prompt_tokens": p, "completion_tokens": sum(n_out), "total_tokens": p + sum(n_out),
                "tokens_by_model": by}

    def _logprobs(self, tokens, writers, logprobs, k: int | None, offset: int = 0):
        """The OpenAI form of the log-probabilities of `tokens` (None when not asked)."""
        if k is None:
            return None
        dec = self.s.tok.decode
        name = (lambda i: f"token_id:{i}") if self.reply.tokens_as_ids else (lambda i: dec([i]))
        if self.chat:
            content = []
            for tok, w, lp in zip(tokens, writers, logprobs):
                if lp is None:
                    continue
                text = name(tok)
                content.append({"token": text, "logprob": lp[0], "bytes": list(text.encode("utf-8")), "writer": w,
                                "top_logprobs": [{"token": (t := name(i)), "logprob": v,
                                                  "bytes": list(t.encode("utf-8"))} for i, v in lp[1]]})
            return {"content": content}
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tok, lp in zip(tokens, logprobs):
            if lp is None:
                continue
            text = dec([tok])
            out["tokens"].append(name(tok))
            out["token_logprobs"].append(lp[0])
            top: dict[str, float] = {}
            for i, v in [*lp[1], (tok, lp[0])]:  # keyed by text: the most likely of tokens that decode alike
                top.setdefault(name(i), v)
            out["top_logprobs"].append(top)
            out["text_offset"].append(offset)
            offset += len(text)
        return out

    async def _watch_disconnect(self, request: Request) -> None:
        while True:
            await asyncio.sleep(0.25)
            if await request.is_disconnected():
                self.abort()
                return

    # ------------------------------------------------------------- a stream
    async def stream(self, deadline: float | None = None):
        """Server-sent events of every choice, interleaved as their tokens come."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, gen) -> None:
            try:
                async for ev in gen:
                    await queue.put((i, ev))
            except (RuntimeUnavailable, ValueError) as exc:  # the headers are sent: say it in the stream
                await queue.put((i, exc))

        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(self.gens)]
        toks: list[list[int]] = [[] for _ in self.choices]
        finals: list[Final | None] = [None] * len(self.choices)
        offsets = [len(c.echo) for c in self.choices]
        try:
            for c in self.choices:
                if self.chat:
                    yield self._chunk(c, {"role": "assistant", "content": ""}, [], None, [], None)
                elif c.echo:
                    yield self._chunk(c, c.echo, [], None, [], None)
            while any(f is None for f in finals):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    i, ev = await asyncio.wait_for(queue.get(), left)
                except asyncio.TimeoutError:
                    msg = f"the request did not finish within {self.s.limits.request_timeout_s} s"
                    err = {"message": msg, "type": "timeout"}
                    if not self.s.fe.healthy:
                        err = {"message": f"{msg} while the runtime was unavailable: {self.s.fe.failure}",
                               "type": "server_error", "code": "unavailable"}
                    yield sse({"error": err})
                    break
                if isinstance(ev, Exception):
                    yield sse({"error": {"message": f"the request failed: {ev}", "type": "server_error"}})
                    break
                c = self.choices[i]
                if isinstance(ev, Final):
                    if finals[i] is not None:
                        continue  # already sent with its last tokens
                    if ev.reason == "unavailable":
                        yield sse({"error": {"message": f"the runtime is unavailable: {ev.error}",
                                             "type": "server_error", "code": "unavailable"}})
                        break
                    if ev.reason == "error":
                        yield sse({"error": {"message": f"the request failed: {ev.error}", "type": "server_error"}})
                        break
                    if ev.reason == "abort":
                        break
                    finals[i] = ev
                    yield self._chunk(c, ev.text, [], ev, toks[i], None, extra={"tokens_by_model": ev.written_by})
                    continue
                toks[i] += ev.tokens
                end = ev.final if ev.final is not None and ev.final.reason in ("stop", "length") else None
                text = ev.text + (end.text if end else "")
                lp = self._logprobs(ev.tokens, ev.writers, ev.logprobs, c.params.logprobs, offsets[i])
                offsets[i] += len(text)
                finals[i] = end
                yield self._chunk(c, text, ev.tokens, end, toks[i], lp, ev.writers,
                                  extra={"tokens_by_model": end.written_by} if end else None)
            else:
                if self.reply.include_usage:
                    yield sse({"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                               "choices": [], "usage": self._usage([len(t) for t in toks], finals)})
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.close()

    @property
    def _object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, c: Choice, text, token_ids: list[int], final: Final | None, output: list[int], logprobs,
               writers: list[str] | None = None, extra: dict | None = None) -> str:
        """One event of choice `c`: `text` (a dict: a chat delta as it is), its tokens, and
        the choice's end when `final` (`output`: every token of the choice so far)."""
        finish = None if final is None else final.reason
        why = None if final is None else stop_reason(final, output, c.stop_ids)
        tools = self.tool_replies.get(c.index) if isinstance(text, str) else None
        if tools is not None:  # text and calls, as far as the text so far tells them apart
            text, finish = tools.delta(text, final is not None), finish and tools.finish_reason(finish)
        if self.chat:
            delta = text if isinstance(text, dict) else ({"content": text} if text or final is None else {})
            choice = {"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if final is not None:
            choice["stop_reason"] = why
        if isinstance(text, str) or tools is not None:
            choice.update(token_ids=token_ids, token_writers=writers or [])
        body = {"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                "choices": [choice], **(extra or {})}
        if c.index not in self.opened:
            self.opened.add(c.index)
            (body if self.chat else choice).update(self._prompt(c))
        return sse(body)


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def stop_reason(final: Final, tokens: list[int], client_stop_ids: frozenset[int]):
    """vLLM's `stop_reason`: the stop string that matched, the client's stop token id that
    ended the output, or None (end of sequence, length)."""
    if final.stop_reason is not None:
        return final.stop_reason
    if final.reason == "stop" and tokens and tokens[-1] in client_stop_ids:
        return tokens[-1]
    return None


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
