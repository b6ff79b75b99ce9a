"""The per-token dispatcher of "standard serving": one stock server per model, and a client
that asks the writer of the moment for one token at a time and applies the routing
program to what comes back (`llamacpp.LlamaCppStandard`, `vllm_peers.VllmStandard`).

Each step sends the request's whole context to the current writer's server (whose cache
of the request's earlier calls makes that a short extend at best), reads the sampled
token and the top-N log-probabilities, and asks the program's own IR interpreter
(`compiler.backend.interpreter`, the oracle the runtime is tested against) what to do:
the row is rebuilt from the top N with the remaining mass spread evenly over the other
tokens, so coins are exact and entropy rules are approximated only in the tail. It never
looks ahead: the decision for a position is made from that position's output alone.

`run_dispatched` is such a run over HTTP: a keep-alive client per writer's server, each
writer's calls and the seconds spent in them. `timed_all` times requests as every peer over
HTTP does (the `*_large` peers too): each from when its turn comes (a free place under the
concurrency, a free slot) to its answer, and the wall time of them all.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, AsyncContextManager, Awaitable, Callable

import numpy as np

from tokenrouter.compiler.backend.interpreter import RequestStep
from tokenrouter.compiler.needs import writer_needs
from tokenrouter.protocol.sampling import SamplingParams

from tokenrouter.bench.deploy import Measurement

# (writer, the context so far) -> (the sampled token, its top-N [{"id", "logprob"}], or None
# when the server did not return them)
NextToken = Callable[[str, list[int]], Awaitable[tuple[int, list[dict] | None]]]


def check_dispatchable(program, peer: str) -> None:
    """A stock server returns a token's top-N distribution, nothing more: refuse programs
    that need more (a ValueError naming `peer`)."""
    if program.ensembles:
        raise ValueError(f"{peer} cannot serve an ensemble: a stock server returns no full distribution")
    for m in program.models:
        needs = writer_needs(program, m.name)
        if needs.hidden_layers or needs.token_embedding:
            raise ValueError(f"{peer} cannot run this program: {m.name}'s routing reads hidden states, "
                             "which a stock server does not return")


def measurement(name: str, concurrency: int, wall: float, outs: list, threads: dict[str, int],
                calls: dict[str, int], busy: dict[str, float]) -> Measurement:
    """A dispatched run's `Measurement` from its requests' ((tokens, written by), latency)."""
    written: dict[str, int] = {}
    for (_, wb), _ in outs:
        for k, v in wb.items():
            written[k] = written.get(k, 0) + v
    m = Measurement(name, concurrency, wall, sum(len(t) for (t, _), _ in outs), [lat for _, lat in outs],
                    written, [t for (t, _), _ in outs], threads=threads)
    m.steps = dict(calls)  # one HTTP call per request-step
    m.phase_s = {w: {"http_call": busy[w]} for w in busy}
    return m


async def timed_all(prompts, turn: Callable[[], AsyncContextManager], one) -> tuple[list, float]:
    """Every prompt's `await one(i, prompt, held)` at once, each timed from when `turn()` (an
    async context manager: a semaphore, a free slot; `held` is what it yields) lets it in:
    ([(result, seconds)], wall seconds)."""
    async def timed(i, p):
        async with turn() as held:
            t0 = time.perf_counter()
            out = await one(i, p, held)
            return out, time.perf_counter() - t0

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(timed(i, p) for i, p in enumerate(prompts)))
    return outs, time.perf_counter() - t0


RETRIES = 3


async def resend(httpx, send, who: str, retries: int = RETRIES):
    """`await send()` (an HTTP call: a pure function of its body, which the server's cache
    makes cheap to repeat), sent again when the connection drops under it: a keep-alive
    connection that the server closes just as the next call goes out is an ordinary event
    over the thousands of calls a run makes (seen at N = 16 on llama.cpp's server, at N = 32
    on vLLM's). Returns (the response, the times it was sent again); a server that keeps
    failing is a RuntimeError naming it (`who`)."""
    for attempt in range(retries + 1):
        try:
            return await send(), attempt
        except httpx.TransportError as exc:
            if attempt == retries:
                raise RuntimeError(f"{who} failed {retries + 1} times in a row: {type(exc).__name__}: {exc}") from exc
            print(f"{who}: connection dropped ({type(exc).__name__}), sending the call again", file=sys.stderr)


async def run_dispatched(httpx, name: str, concurrency: int, prompts, servers: dict[str, Any],
                         turn: Callable[[], AsyncContextManager], request) -> Measurement:
    """A per-token dispatcher's run over HTTP: one keep-alive client (the `httpx` module's)
    per writer's server (`servers`: writer -> a server with `url` and `threads`), every
    prompt's `request(call, i, prompt, held)` at once through `timed_all` (`turn` and `held`
    as there), where `await call(writer, send)` is `await send(the writer's client)` counted
    as one call of the writer's, with its seconds (sent again where its connection dropped:
    `resend`); the run's `measurement`."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    clients = {w: httpx.AsyncClient(base_url=s.url, limits=limits, timeout=600.0) for w, s in servers.items()}
    calls = {w: 0 for w in servers}
    busy = {w: 0.0 for w in servers}

    async def call(writer: str, send):
        t0 = time.perf_counter()
        r, _ = await resend(httpx, lambda: send(clients[writer]), f"{name}: the server of {writer!r}")
        busy[writer] += time.perf_counter() - t0
        calls[writer] += 1
        return r

    try:
        outs, wall = await timed_all(prompts, turn, lambda i, p, held: request(call, i, p, held))
    finally:
        for c in clients.values():
            await c.aclose()
    return measurement(name, concurrency, wall, outs, {w: s.threads for w, s in servers.items()}, calls, busy)


def logits_row(top: list[dict], vocab: int):
    """A float64 log-probability row rebuilt from the top-N entries (`id`, `logprob`): the
    mass they leave is spread evenly over the other ids (so argmax, top probabilities and
    margins are exact; entropy is approximated only in the tail)."""
    row = np.empty(vocab, dtype=np.float64)
    ids = np.array([t["id"] for t in top], dtype=np.int64)
    lp = np.array([t["logprob"] for t in top], dtype=np.float64)
    rest = max(0.0, 1.0 - float(np.exp(lp).sum()))
    others = vocab - len(ids)
    row.fill(np.log(rest / others) if rest > 0 and others > 0 else -np.inf)
    row[ids] = lp
    return row


async def route_request(interp, start: str, vocab: int, next_token: NextToken, prompt: list[int],
                        sampling: SamplingParams, route_seed: int) -> tuple[list[int], dict[str, int], int]:
    """One request, token by token: (output tokens, tokens by writer, steps whose
    distribution the server held back, routed as if the token were certain)."""
    tokens = list(prompt)
    out: list[int] = []
    written: dict[str, int] = {}
    writer, visit, blind = start, 0, 0
    while len(out) < sampling.max_tokens:
        tok, top = await next_token(writer, tokens)
        if top is None:
            top, blind = [{"id": tok, "logprob": 0.0}], blind + 1
        step = RequestStep(logits=logits_row(top, vocab), sampled=tok, visit_tokens=visit + 1,
                           position=len(out), request_seed=route_seed)
        d = interp.route(writer, step)
        if d.keep:
            tokens.append(tok)
            out.append(tok)
            written[writer] = written.get(writer, 0) + 1
            visit += 1
            if tok in sampling.stop_token_ids:
                break
        if d.dest != writer:
            writer, visit = d.dest, 0
    return out, written, blind
