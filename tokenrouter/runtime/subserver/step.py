"""The routed step of one writer over a batch of its requests, shared by the subserver and
the lockstep baseline (the single-request reference, `reference.py`, stays independent:
it is the oracle this is tested against).

    feed     each request the tokens its KV lacks, `tokens[fed:]`: the prompt on a first
             visit (prefill), a peer's suffix on a return (extend), or one token (decode)
    forward  every member engine once over the whole batch (one, or an ensemble's members)
    combine  an ensemble's member logits into its log-probabilities (compiled `combine`)
    sample   one token per request (`engine/sampler.py`) from the logits after the request's
             penalties, logit bias and structured-output mask (`engine/logits.py`); the
             log-probabilities of the token, when the request asks for them, are the
             writer's own distribution's
    route    the compiled `route` for the whole batch: next writer, keep or rewrite
    commit   kept tokens are appended; a request ends at a stop token, at `max_tokens` or
             at the context limit; the others stay or depart, their next writer set

Invariant 1 of docs/architecture.md holds by construction: a request's KV length is the
engine's `seq_len`, and the step feeds exactly the tokens after it. A request with nothing
to feed came back without a new token (two writers rewriting each other's token): it is
not stepped but reported as `looped`, since the program would never make progress.

A request with structured output has a grammar state here (`Request.grammar`), advanced
before each step by the output tokens it has not consumed: this writer's last token, or the
suffix other writers wrote while the request was away. Output its grammar refuses fails
that request alone (`failed`).

The runner only changes requests (their route state and KV); what is sent where, and how
the scheduler hears of it, is the caller's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tokenrouter.protocol.step import StepTensors
from tokenrouter.runtime.engine.grammar import GrammarError, Grammars
from tokenrouter.runtime.engine.logits import LogitsRow, process_logits
from tokenrouter.runtime.engine.sampler import TokenLogprobs, sample, token_logprobs
from tokenrouter.runtime.subserver.request import Request

LOOP_ERROR = "request came back with no new token (two writers rewrite each other's token in a loop)"


class StepFailure(RuntimeError):
    """Raised by the test hook (`StepRunner.fail_next`) to prove failures end requests with an error."""


@dataclass
class StepResult:
    looped: list[Request] = field(default_factory=list)  # nothing new to feed: not stepped
    failed: list[tuple[Request, str]] = field(default_factory=list)  # its grammar refused its output: not stepped
    stepped: list[Request] = field(default_factory=list)  # the others, in batch order
    error: Exception | None = None  # the step raised before its commit: `stepped` are unchanged
    fed_tokens: int = 0
    committed: list[tuple[Request, int, int]] = field(default_factory=list)  # (request, output position, token)
    rewritten: int = 0  # sampled tokens dropped (their next writer writes that position)
    ended: list[tuple[Request, str]] = field(default_factory=list)  # reason: "stop" | "length"
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)  # rid -> its committed token's, when asked
    stayed: list[Request] = field(default_factory=list)
    departing: list[tuple[Request, str]] = field(default_factory=list)  # and their next writer


class StepRunner:
    """Steps one writer: its member engines (a model, or an ensemble's models) and its router."""

    def __init__(self, writer: str, writers: list[str], members: tuple[str, ...], engines: dict,
                 router, phase_s: dict[str, float], grammars: Grammars | None = None):
        self.grammars = grammars  # compiles structured-output specs (None: such requests fail)
        self.writer, self.writers, self.index = writer, list(writers), writers.index(writer)
        self.members = tuple(members)
        self.engines = {m: engines[m] for m in self.members}
        self.ensemble = self.members != (writer,)
        self.router = router
        self.needs = router.needs
        self.max_model_len = min(e.max_model_len for e in self.engines.values())
        self.phase_s = phase_s  # the caller's step-phase counters, added to here
        self.fail_next = 0  # test hook: the next n steps raise StepFailure

    def fed(self, r: Request) -> int:
        """Tokens of `r` in this writer's KV."""
        return self.engines[self.members[0]].seq_len(r.seq)

    def run(self, reqs: list[Request]) -> StepResult:
        res = StepResult()
        for r in reqs:
            if self.fed(r) >= len(r.state.tokens):
                res.looped.append(r)
                continue
            why = self._advance_grammar(r)
            if why:
                res.failed.append((r, why))
            else:
                res.stepped.append(r)
        if not res.stepped:
            return res
        try:
            sampled, dests, keeps, logprobs = self._forward(res)
        except Exception as exc:
            res.error = exc
            return res
        t0 = time.perf_counter()
        self._commit(res, sampled, dests, keeps, logprobs)
        self.phase_s["bookkeeping"] += time.perf_counter() - t0
        return res

    def _forward(self, res: StepResult):
        """Feed, forward, combine, sample and route: (sampled, dests, keeps) as lists."""
        reqs, ph = res.stepped, self.phase_s
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StepFailure(f"{self.writer}: injected step failure (debug_fail)")
        t0 = time.perf_counter()
        items = [(r.seq, r.state.tokens[self.fed(r):]) for r in reqs]
        fits = all(e.can_append(items) for e in self.engines.values())
        ph["bookkeeping"] += time.perf_counter() - t0
        if not fits:
            raise RuntimeError(f"{self.writer}: KV cache full for a batch of {len(items)}")
        res.fed_tokens = sum(len(t) for _, t in items)

        t0 = time.perf_counter()
        outs = [self.engines[m].step(items, self.needs) for m in self.members]
        t1 = time.perf_counter()
        ph["forward"] += t1 - t0

        positions = torch.tensor([r.n_out for r in reqs], dtype=torch.int64)
        visit = torch.tensor([r.state.visit_tokens + 1 for r in reqs], dtype=torch.int64)
        seeds = torch.tensor([r.state.route_seed for r in reqs], dtype=torch.int64)  # the coins' seeds
        if self.ensemble:
            member_logits = tuple(o.logits for o in outs)
            logits = self.router.combine(StepTensors(logits=None, sampled=None, visit_tokens=visit, position=positions,
                                                     request_seed=seeds, member_logits=member_logits))
        else:
            member_logits = ()
            logits = outs[0].logits
        rows = [LogitsRow(r.params, r.state.tokens, r.state.prompt_len, r.grammar) for r in reqs]
        sampled = sample(process_logits(logits, rows), [r.params for r in reqs], positions.tolist())
        logprobs = token_logprobs(logits, sampled, [r.params.logprobs for r in reqs])
        t2 = time.perf_counter()
        ph["sample"] += t2 - t1

        step = StepTensors(logits=None if self.ensemble else logits, sampled=sampled,
                           visit_tokens=visit, position=positions, request_seed=seeds,
                           hidden={} if self.ensemble else dict(outs[0].hidden),
                           member_logits=member_logits)
        if self.needs.token_embedding and not self.ensemble:
            step.token_embedding = self.engines[self.writer].embed(sampled)
        dests, keeps = self.router.route(step).tolist()
        ph["route"] += time.perf_counter() - t2
        return sampled.tolist(), dests, keeps, logprobs

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

    def _commit(self, res: StepResult, sampled, dests, keeps, logprobs) -> None:
        for r, tok, dest, keep, lp in zip(res.stepped, sampled, dests, keeps, logprobs):
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
