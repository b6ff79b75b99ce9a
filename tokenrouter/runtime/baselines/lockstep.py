"""Lockstep: every model stepped together in one loop, in one process.

Each iteration steps every writer once on the requests it currently holds, so every
request advances by at most one token per iteration and every iteration lasts as long as
the slowest model's step (the step desynchronisation the TokenRouter paper describes).
It keeps each model's KV for each request between visits (it has no prefix matching to
do), uses the compiled routers, and produces the same tokens as the runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenrouter.compiler import ir
from tokenrouter.compiler.abi import RouteState, StepTensors
from tokenrouter.runtime.metrics import PHASES


@dataclass
class LockstepOutput:
    token_ids: list[int]
    finish_reason: str
    tokens_by_model: dict[str, int] = field(default_factory=dict)


@dataclass
class _Req:
    i: int
    state: RouteState
    params: Any
    stop: frozenset[int]


class Lockstep:
    def __init__(self, program: ir.Program, models: dict[str, Any] | None = None, block_size: int = 16,
                 num_blocks: int | None = None, threads: int = 0, base_dir: str | None = None):
        import torch

        from tokenrouter.compiler.compiled import load_routers
        from tokenrouter.runtime.engine.engine import Engine
        from tokenrouter.runtime.engine.sampler import sample
        from tokenrouter.runtime.loader import load_model, quant_kwargs

        if threads:
            torch.set_num_threads(threads)
        self.torch, self.sample = torch, sample
        self.program = program
        self.writers = program.writers()
        dtype = getattr(torch, program.models[0].dtype)
        self.routers = load_routers(program, dtype=dtype, base_dir=base_dir)
        self.members = {e.name: e.members for e in program.ensembles}
        self.engines = {}
        for m in program.models:
            md = getattr(torch, m.dtype)
            lm = (models or {}).get(m.name) or load_model(m.path, dtype=md, quant=m.quant)
            kw = {"dtype": md, "block_size": block_size, **quant_kwargs(lm, m.quant)}
            if num_blocks:
                kw["num_blocks"] = num_blocks
            self.engines[m.name] = Engine(lm.config, lm.weights, **kw)
        self.phase_s = {p: 0.0 for p in PHASES}
        self.iterations = 0

    def generate(self, prompts: list[list[int]], params, stop_token_ids=(), concurrency: int = 8,
                 seeds: list[int] | None = None) -> list[LockstepOutput]:
        """Greedy/sampled generation for token-id prompts, at most `concurrency` at a time."""
        stop = frozenset(params.stop_token_ids) | frozenset(stop_token_ids)
        todo = list(range(len(prompts)))[::-1]
        active: list[_Req] = []
        outs: list[LockstepOutput | None] = [None] * len(prompts)
        while todo or active:
            while todo and len(active) < concurrency:
                i = todo.pop()
                st = RouteState(rid=str(i), tokens=list(prompts[i]), prompt_len=len(prompts[i]),
                                writer=self.program.start, seed=seeds[i] if seeds else 0)
                active.append(_Req(i, st, params, stop))
            self.iterations += 1
            finished: list[_Req] = []
            batches = {w: [r for r in active if r.state.writer == w] for w in self.writers}
            for w, batch in batches.items():  # one step per writer, in turn: the lockstep
                if batch:
                    finished += self._step(w, batch, outs)
            active = [r for r in active if r not in finished]
        return outs  # type: ignore[return-value]

    def _seq(self, r: _Req) -> str:
        return r.state.rid

    def _step(self, w: str, batch: list[_Req], outs) -> list[_Req]:
        torch = self.torch
        t0 = time.perf_counter()
        members = self.members.get(w, (w,))
        eng0 = self.engines[members[0]]
        items = [(self._seq(r), r.state.tokens[eng0.seq_len(self._seq(r)):]) for r in batch]
        router = self.routers[w]
        t1 = time.perf_counter()
        res = [self.engines[m].step(items, router.needs) for m in members]
        t2 = time.perf_counter()
        pos = torch.tensor([len(r.state.tokens) - r.state.prompt_len for r in batch])
        visit = torch.tensor([r.state.visit_tokens + 1 for r in batch])
        seeds = torch.tensor([r.state.seed for r in batch])
        if w in self.members:
            ml = tuple(o.logits for o in res)
            logits = router.combine(StepTensors(None, None, visit, pos, seeds, member_logits=ml))
            step = StepTensors(None, None, visit, pos, seeds, member_logits=ml)
        else:
            logits = res[0].logits
            step = StepTensors(logits, None, visit, pos, seeds, hidden=dict(res[0].hidden))
        sampled = self.sample(logits, [r.params for r in batch], pos.tolist())
        t3 = time.perf_counter()
        step.sampled = sampled
        if router.needs.token_embedding and w not in self.members:
            step.token_embedding = self.engines[w].embed(sampled)
        dest, keep = router.route(step).tolist()
        t4 = time.perf_counter()
        done = []
        for r, tok, d, k in zip(batch, sampled.tolist(), dest, keep):
            st = r.state
            if k:
                st.tokens.append(tok)
                st.visit_tokens += 1
                st.written_by[w] = st.written_by.get(w, 0) + 1
                n = len(st.tokens) - st.prompt_len
                reason = "stop" if tok in r.stop else ("length" if n >= r.params.max_tokens else None)
                if reason:
                    outs[r.i] = LockstepOutput(st.tokens[st.prompt_len:], reason, dict(st.written_by))
                    for e in self.engines.values():
                        e.free(self._seq(r))
                    done.append(r)
                    continue
            if d != self.writers.index(w):
                st.writer, st.visit_tokens = self.writers[d], 0
        t5 = time.perf_counter()
        for k, v in (("schedule", t1 - t0), ("forward", t2 - t1), ("sample", t3 - t2), ("route", t4 - t3),
                     ("bookkeeping", t5 - t4)):
            self.phase_s[k] += v
        return done

    def blocks_used(self) -> dict[str, int]:
        return {n: e.blocks_used for n, e in self.engines.items()}
