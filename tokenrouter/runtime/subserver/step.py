"""The routed step of one writer over a batch of its requests, shared by the subserver and
the lockstep baseline (the single-request reference, `reference.py`, stays independent:
it is the oracle this is tested against).

    feed     each request the tokens its KV lacks, `tokens[fed:]`: the prompt on a first
             visit (prefill), a peer's suffix on a return (extend), or one token (decode)
    forward  the writer's engine once over the whole batch (a model, or an ensemble's
             members combined by the compiled `combine`)
    sample   one token per request (`engine/sampler.py`) from the logits after the request's
             penalties, logit bias and structured-output mask (`engine/logits.py`); the
             log-probabilities of the token, when the request asks for them, are the
             writer's own distribution's
    route    the compiled `route` for the whole batch: next writer, keep or rewrite
    commit   kept tokens are appended; a request ends at a stop token, at `max_tokens` or
             at the context limit; the others stay or depart, their next writer set

The engine is a `WriterEngine`: feed, step (its results: a decision per request), park,
release. Each engine implements it in its own package (`tokenrouter/engines.py` registers
them): `NativeWriter` (`runtime/native/`, tokenrouter's engine) and `VllmWriter`
(`runtime/vllm/`), where sample and route run inside vLLM's logits processor. Both sample
and route through `sample_and_route`, and `StepRunner` commits their decisions the same
way, so the routing semantics exist once.

Invariant 1 of docs/architecture.md holds by construction: a request's KV length is the
engine's `fed`, and the step feeds exactly the tokens after it. A request with nothing to
feed came back without a new token (two writers rewriting each other's token): it is not
stepped but reported as `looped`, since the program would never make progress.

A request with structured output has a grammar state here (`Request.grammar`), advanced
before each step by the output tokens it has not consumed: this writer's last token, or the
suffix other writers wrote while the request was away. Output its grammar refuses, or a
feature the writer's engine cannot give it (`WriterEngine.refuses`), fails that request
alone (`failed`).

The runner only changes requests (their route state and KV); what is sent where, and how
the scheduler hears of it, is the caller's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.step import StepTensors
from tokenrouter.runtime.engine.grammar import GrammarError, Grammars, GrammarState
from tokenrouter.runtime.engine.logits import LogitsRow, process_logits
from tokenrouter.runtime.engine.sampler import TokenLogprobs, sample, token_logprobs
from tokenrouter.runtime.subserver.request import Request

LOOP_ERROR = "request came back with no new token (two writers rewrite each other's token in a loop)"


class StepFailure(RuntimeError):
    """Raised by the test hook (`StepRunner.fail_next`) to prove failures end requests with an error."""


# ------------------------------------------------------------------ sample and route

@dataclass(frozen=True)
class RowFacts:
    """What sampling and routing read of one request's step besides its logits."""

    params: SamplingParams
    position: int  # output position of the token sampled now
    visit_tokens: int  # tokens of this visit, counting the one sampled now
    route_seed: int
    tokens: Sequence[int] = ()  # prompt then output: what penalties read (`engine/logits.py`)
    prompt_len: int = 0
    grammar: GrammarState | None = None

    @staticmethod
    def of(r: Request) -> "RowFacts":
        st = r.state
        return RowFacts(r.params, r.n_out, st.visit_tokens + 1, st.route_seed, st.tokens, st.prompt_len, r.grammar)


def row_tensors(rows: list[RowFacts]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position, visit_tokens, request_seed) as the router's int64 tensors."""
    return (torch.tensor([f.position for f in rows], dtype=torch.int64),
            torch.tensor([f.visit_tokens for f in rows], dtype=torch.int64),
            torch.tensor([f.route_seed for f in rows], dtype=torch.int64))


def sample_and_route(router, logits, rows: list[RowFacts], *, hidden=None, member_logits=(), embed=None,
                     phase_s: dict[str, float] | None = None) -> list[tuple[int, int, int, Any]]:
    """One token per row from `logits` [B, V] (an ensemble's combined log-probabilities)
    after each request's logits processing, then the compiled `route` once for the whole
    batch: (sampled, dest writer index, keep, the token's log-probabilities or None) per
    row. An ensemble's router reads `member_logits` instead of the logits; `embed` gives
    the sampled tokens' embeddings when the router reads them; `phase_s` (when given) gets
    the time of each phase."""
    t0 = time.perf_counter()
    positions, visit, seeds = row_tensors(rows)
    params = [f.params for f in rows]
    processed = process_logits(logits, [LogitsRow(f.params, f.tokens, f.prompt_len, f.grammar) for f in rows])
    sampled = sample(processed, params, positions.tolist())
    logprobs = token_logprobs(logits, sampled, [p.logprobs for p in params])
    t1 = time.perf_counter()
    step = StepTensors(logits=None if member_logits else logits, sampled=sampled, visit_tokens=visit,
                       position=positions, request_seed=seeds, hidden=dict(hidden or {}),
                       member_logits=tuple(member_logits))
    if router.needs.token_embedding and embed is not None:
        step.token_embedding = embed(sampled)
    dests, keeps = router.route(step).tolist()
    if phase_s is not None:
        phase_s["sample"] += t1 - t0
        phase_s["route"] += time.perf_counter() - t1
    return list(zip(sampled.tolist(), dests, keeps, logprobs))


# ------------------------------------------------------------------ the engine interface

Decision = tuple[int, int, int, TokenLogprobs | None]  # (sampled token, dest writer index, keep, logprobs)


class WriterEngine(Protocol):
    """What a subserver steps: a writer's engine with its compiled router."""

    max_model_len: int
    vocab_size: int
    block_size: int  # tokens per KV block, as the frontend's admission counts them
    blocks_total: int  # blocks one request can reserve from
    computed_tokens: int  # tokens its forwards computed, by the engine's own count

    def kv_usage(self) -> tuple[int, int]:
        """(blocks used, blocks in all) for the metrics."""

    def refuses(self, r: Request) -> str | None:
        """Why this engine cannot step `r` (a feature it cannot give), or None."""

    def fed(self, r: Request) -> int:
        """Tokens of `r` in this writer's KV."""

    def feed(self, reqs: list[Request]) -> int:
        """Hand the engine each request's `tokens[fed:]` for the next step; the tokens fed.
        Raises when they cannot run (the KV cache is full)."""

    def step(self, reqs: list[Request]) -> list[Decision | None]:
        """One forward over the fed batch, then sample and route: a decision per request,
        None for one the engine has not finished feeding yet (it stays ready)."""

    def park(self, r: Request) -> None:
        """`r` stops stepping here (departed, ended or failed); its KV stays until `release`."""

    def release(self, r: Request) -> None:
        """`r` ended everywhere: free its KV."""

    def between_layers(self, hook) -> None:
        """Call `hook()` between the layers of each forward (a subserver sharing the host's
        cores re-reads its share there: `runtime/cores.py`); an engine that manages its own
        threads ignores it."""


# ------------------------------------------------------------------ the step

@dataclass
class StepResult:
    looped: list[Request] = field(default_factory=list)  # nothing new to feed: not stepped
    failed: list[tuple[Request, str]] = field(default_factory=list)  # refused (grammar, engine): not stepped
    stepped: list[Request] = field(default_factory=list)  # the others, in batch order
    error: Exception | None = None  # the step raised before its commit: `stepped` are unchanged
    fed_tokens: int = 0
    prompt_tokens: int = 0  # of those, the tokens at prompt positions (a prefill's)
    deferred: list[Request] = field(default_factory=list)  # stepped, but no token yet: still ready
    committed: list[tuple[Request, int, int]] = field(default_factory=list)  # (request, output position, token)
    rewritten: int = 0  # sampled tokens dropped (their next writer writes that position)
    ended: list[tuple[Request, str]] = field(default_factory=list)  # reason: "stop" | "length"
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)  # rid -> its committed token's, when asked
    stayed: list[Request] = field(default_factory=list)
    departing: list[tuple[Request, str]] = field(default_factory=list)  # and their next writer


class StepRunner:
    """Steps one writer's engine and commits what its router decided."""

    def __init__(self, writer: str, writers: list[str], engine: WriterEngine, phase_s: dict[str, float],
                 grammars: Grammars | None = None):
        self.grammars = grammars  # compiles structured-output specs (None: such requests fail)
        self.writer, self.writers, self.index = writer, list(writers), writers.index(writer)
        self.engine = engine
        self.max_model_len = engine.max_model_len
        self.phase_s = phase_s  # the caller's step-phase counters, added to here
        self.fail_next = 0  # test hook: the next n steps raise StepFailure

    def fed(self, r: Request) -> int:
        """Tokens of `r` in this writer's KV."""
        return self.engine.fed(r)

    def run(self, reqs: list[Request]) -> StepResult:
        res = StepResult()
        for r in reqs:
            if self.fed(r) >= len(r.state.tokens):
                res.looped.append(r)
                continue
            why = self.engine.refuses(r) or self._advance_grammar(r)
            if why:
                res.failed.append((r, why))
            else:
                res.stepped.append(r)
        if not res.stepped:
            return res
        try:
            decisions = self._forward(res)
        except Exception as exc:
            res.error = exc
            return res
        t0 = time.perf_counter()
        self._commit(res, decisions)
        self.phase_s["bookkeeping"] += time.perf_counter() - t0
        return res

    def _forward(self, res: StepResult) -> list[Decision | None]:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StepFailure(f"{self.writer}: injected step failure (debug_fail)")
        t0 = time.perf_counter()
        res.prompt_tokens = sum(max(0, r.state.prompt_len - self.fed(r)) for r in res.stepped)
        res.fed_tokens = self.engine.feed(res.stepped)
        self.phase_s["bookkeeping"] += time.perf_counter() - t0
        return self.engine.step(res.stepped)

    def _advance_grammar(self, r: Request) -> str | None:
        """Bring a structured-output request's grammar state up to its output (created at its
        first step here); why it fails, if it does."""
        spec = r.params.structured
        if spec is None:
            return None
        try:
            if r.grammar is None:
                if self.grammars is None:
                    return f"{self.writer}: structured output is not available on this writer"
                r.grammar = self.grammars.state(spec)
            r.grammar.advance(r.state.tokens[r.state.prompt_len:])
        except GrammarError as exc:
            return f"{self.writer}: {exc}"
        return None

    def _commit(self, res: StepResult, decisions: list[Decision | None]) -> None:
        for r, d in zip(res.stepped, decisions):
            if d is None:
                res.deferred.append(r)
                continue
            tok, dest, keep, lp = d
            if keep:
                res.committed.append((r, r.n_out, tok))
                if lp is not None:
                    res.logprobs[r.rid] = lp
                r.commit(tok, self.writer)
                reason = r.end_reason(tok, self.max_model_len)
                if reason is not None:
                    res.ended.append((r, reason))
                    continue
            else:
                res.rewritten += 1
            if dest == self.index:
                res.stayed.append(r)
            else:
                r.state.writer, r.state.visit_tokens = self.writers[dest], 0
                res.departing.append((r, self.writers[dest]))
