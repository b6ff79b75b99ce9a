"""The single-request reference implementation: the oracle the served outputs are tested against.

It follows one request through the program as the papers describe it, and shares nothing
with the serving path that could hide a bug there: no scheduler, no messages, no KV
reuse (every step is a fresh prefill of everything the writer sees, on a sequence freed
right after), and the routing decisions come from the IR's reference interpreter
(`compiler.backend.interpreter`), not from the compiled router. Only the engine forward and the
sampler are shared, and those are tested on their own against transformers; the sampler's
inputs (penalties, logit bias, structured output: `engine/logits.py`) are computed here
from the request's whole token list and a grammar state advanced token by token, never
from the serving path's per-writer suffix bookkeeping. A model served by vLLM (`engine =
vllm`) runs on vLLM here too, one fresh request per step (`runtime/vllm/logits.py`): the
oracle of a writer is its own engine's forward (its `reference_model`, `tokenrouter/engines.py`).

So a served request that matches this, token for token, has had its KV appended
correctly on every visit (invariant 1) and was routed as the program says, whatever
batches it shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import default_base_dir
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep
from tokenrouter.compiler.needs import writer_needs
from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.grammar import Grammars, GrammarState
from tokenrouter.runtime.engine.logits import LogitsRow, process_logits
from tokenrouter.runtime.engine.sampler import SamplingParams, sample
from tokenrouter.runtime.loader import program_tokenizer


@dataclass
class ReferenceOutput:
    tokens: list[int]  # output tokens only
    reason: str  # stop | length | error
    written_by: dict[str, int] = field(default_factory=dict)
    handoffs: int = 0
    error: str | None = None
    writers: list[str] = field(default_factory=list)  # the writer of each output token
    gaps: list[float] = field(default_factory=list)  # each output token's top-2 logit gap in its writer's step
    # each output position's closest routing tie: the smallest `Decision.min_gap` of the
    # decisions taken there (a rewrite's and the keeping writer's)
    route_gaps: list[float] = field(default_factory=list)


def top2_gap(step: RequestStep) -> float:
    """How far the step's most likely token led the next (inf without a logits row)."""
    if step.logits is None or len(step.logits) < 2:
        return float("inf")
    a, b = torch.topk(torch.from_numpy(step.logits), 2).values.tolist()
    return a - b


class Reference:
    """Holds one engine per model of the program (random or real weights alike)."""

    def __init__(self, program: ir.Program, models: dict[str, Any] | None = None,
                 base_dir: str | None = None, max_model_len: int | None = None, block_size: int = 16,
                 started: dict[str, Any] | None = None):
        """`models`: preloaded weights by model name; `started`: reference models already
        started by the caller (an engine's `reference_model`), by name, else each is
        started here on the model's own engine."""
        self.program = program
        self.interp = Interpreter(program, base_dir or default_base_dir(program))
        self.shared = dict(started or {})
        self.engines: dict[str, Any] = {
            m.name: self.shared.get(m.name) or engines.implementation(m.engine).reference_model(
                m, models=models, max_model_len=max_model_len, block_size=block_size)
            for m in program.models}
        self.ensembles = {e.name: e for e in program.ensembles}
        self.grammars = Grammars(load=lambda: program_tokenizer(program))

    def close(self) -> None:
        """Stop the reference models this reference started (a vLLM engine's worker)."""
        for name, eng in self.engines.items():
            if eng is not self.shared.get(name):
                eng.close()

    def _forward(self, model: str, tokens: list[int], needs: FeatureNeeds):
        """Logits [V] and hidden {layer: [H]} at the last position, by a fresh prefill."""
        return self.engines[model].forward(tokens, needs)

    def _step(self, writer: str, tokens: list[int], sampling: SamplingParams, pos: int, visit_tokens: int,
              route_seed: int, grammar: GrammarState | None = None) -> tuple[int, RequestStep]:
        """One step of `writer` on `tokens`: the token it samples, and what the interpreter
        reads of the step (computed as a fresh prefill)."""
        needs = writer_needs(self.program, writer)
        ens = self.ensembles.get(writer)
        if ens is not None:
            member = [self._forward(m, tokens, FeatureNeeds())[0] for m in ens.members]
            logp = self.interp.combine(writer, RequestStep(member_logits=tuple(r.double().numpy() for r in member),
                                                           position=pos, request_seed=route_seed))
            logits = torch.from_numpy(logp)
            hidden: dict[int, Any] = {}
            row = None
        else:
            logits, hidden = self._forward(writer, tokens, needs)
            member, row = (), logits
        inputs = LogitsRow(sampling, tokens, len(tokens) - pos, grammar)
        tok = int(sample(process_logits(logits[None], [inputs]), [sampling], [pos])[0])
        emb = None
        if needs.token_embedding and ens is None:
            emb = self.engines[writer].embed(torch.tensor([tok]))[0]
        return tok, RequestStep(
            logits=None if row is None else row.double().numpy(), sampled=tok, visit_tokens=visit_tokens,
            position=pos, request_seed=route_seed,
            hidden={k: v.double().numpy() for k, v in hidden.items()},
            token_embedding=None if emb is None else emb.double().numpy(),
            member_logits=tuple(r.double().numpy() for r in member))

    def generate(self, prompt: list[int], sampling: SamplingParams, route_seed: int = 0,
                 max_model_len: int | None = None) -> ReferenceOutput:
        """One request from `prompt` to a stop token, `max_tokens`, the length limit or a
        rewrite loop (an error), routed by the interpreter; `sampling` draws its tokens,
        `route_seed` seeds the program's coin flips."""
        tokens = list(prompt)
        writer, visit = self.program.start, 0
        out = ReferenceOutput([], "length")
        stop = set(sampling.stop_token_ids)
        limit = max_model_len or min(e.max_model_len for e in self.engines.values())
        seen_at_len: set[str] = set()  # writers that already wrote at this length (loop check)
        route_gap = math.inf  # the closest routing tie at this output position so far
        grammar = None if sampling.structured is None else self.grammars.state(sampling.structured)
        while True:
            pos = len(tokens) - len(prompt)
            if writer in seen_at_len:
                out.reason, out.error = "error", f"rewrite loop at output position {pos}"
                return out
            seen_at_len.add(writer)
            tok, step = self._step(writer, tokens, sampling, pos, visit + 1, route_seed, grammar)
            d = self.interp.route(writer, step)
            route_gap = min(route_gap, d.min_gap)
            if d.keep:
                tokens.append(tok)
                out.tokens.append(tok)
                out.written_by[writer] = out.written_by.get(writer, 0) + 1
                out.writers.append(writer)
                out.gaps.append(top2_gap(step))
                out.route_gaps.append(route_gap)
                route_gap = math.inf
                visit += 1
                seen_at_len = set()
                if tok in stop:
                    out.reason = "stop"
                    return out
                if len(out.tokens) >= sampling.max_tokens or len(tokens) >= limit:
                    out.reason = "length"
                    return out
                if grammar is not None:
                    grammar.advance(out.tokens)
            if d.dest != writer:
                out.handoffs += 1
                writer, visit = d.dest, 0
