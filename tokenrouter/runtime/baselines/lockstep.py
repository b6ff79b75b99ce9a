"""Lockstep: every model stepped together in one loop, in one process.

Each iteration steps every writer once on the requests it currently holds, so every
request advances by at most one token per iteration and every iteration lasts as long as
the slowest model's step (the step desynchronisation the TokenRouter paper describes).
It keeps each model's KV for each request between visits (it has no prefix matching to
do), and steps each writer with the subserver's own step runner (`subserver/step.py`) and
the compiled routers, so it produces the same tokens as the runtime and ends requests by
the same rules (stop token, `max_tokens`, context limit, rewrite loop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model, quant_options
from tokenrouter.runtime.metrics import PHASES
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.native import NativeWriter
from tokenrouter.runtime.subserver.step import LOOP_ERROR, StepRunner


@dataclass
class LockstepOutput:
    token_ids: list[int]
    finish_reason: str  # stop | length | error
    tokens_by_model: dict[str, int] = field(default_factory=dict)
    error: str | None = None


class Lockstep:
    def __init__(self, program: ir.Program, models: dict[str, Any] | None = None, block_size: int = 16,
                 num_blocks: int | None = None, threads: int = 0, base_dir: str | None = None,
                 max_model_len: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.program = program
        self.writers = program.writers()
        dtype = getattr(torch, program.models[0].dtype)
        routers = load_routers(program, dtype=dtype, base_dir=base_dir)
        members = {e.name: e.members for e in program.ensembles}
        self.engines = {}
        for m in program.models:
            md = getattr(torch, m.dtype)
            lm = (models or {}).get(m.name) or load_model(m.path, dtype=md, quant=m.quant)
            kw = {"dtype": md, "block_size": block_size}
            if num_blocks:
                kw["num_blocks"] = num_blocks
            if max_model_len:
                kw["max_model_len"] = max_model_len
            self.engines[m.name] = Engine(lm.config, lm.weights, quant_options(lm, m.quant, **kw))
        self.phase_s = {p: 0.0 for p in PHASES}
        self.runners = {w: StepRunner(w, self.writers, NativeWriter(w, members.get(w, (w,)), self.engines, routers[w],
                                                                    self.phase_s), self.phase_s)
                        for w in self.writers}
        self.iterations = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams, stop_token_ids=(), concurrency: int = 8,
                 route_seeds: list[int] | None = None) -> list[LockstepOutput]:
        """Greedy/sampled generation for token-id prompts, at most `concurrency` at a time;
        `route_seeds[i]` seeds prompt i's coin flips (default: i, as the offline API)."""
        params = params.replace(stop_token_ids=tuple(params.stop_token_ids) + tuple(stop_token_ids))
        todo = list(range(len(prompts)))[::-1]
        active: list[Request] = []
        outs: list[LockstepOutput | None] = [None] * len(prompts)
        while todo or active:
            t0 = time.perf_counter()
            while todo and len(active) < concurrency:
                i = todo.pop()
                st = RouteState(rid=str(i), tokens=list(prompts[i]), prompt_len=len(prompts[i]),
                                writer=self.program.start, route_seed=route_seeds[i] if route_seeds else i,
                                sampling=params)
                active.append(Request(st, st.rid, params))
            self.iterations += 1
            batches = {w: [r for r in active if r.state.writer == w] for w in self.writers}
            self.phase_s["schedule"] += time.perf_counter() - t0
            finished: set[Request] = set()
            for w, batch in batches.items():  # one step per writer, in turn: the lockstep
                if batch:
                    finished |= self._step(w, batch, outs)
            active = [r for r in active if r not in finished]
        return outs  # type: ignore[return-value]

    def _step(self, w: str, batch: list[Request], outs) -> set[Request]:
        res = self.runners[w].run(batch)
        if res.error is not None:
            raise res.error
        ended = [(r, "error") for r in res.looped] + res.ended
        for r, reason in ended:
            st = r.state
            outs[int(st.rid)] = LockstepOutput(st.tokens[st.prompt_len:], reason, dict(st.written_by),
                                               f"{w}: {LOOP_ERROR}" if reason == "error" else None)
            for e in self.engines.values():
                e.free(r.seq)
        return {r for r, _ in ended}

    def blocks_used(self) -> dict[str, int]:
        return {n: e.blocks_used for n, e in self.engines.items()}
