"""`NativeWriter`: the `WriterEngine` of a writer on tokenrouter's engine (`runtime/engine/`),
and `load_writer`, which loads it in the writer's subserver: one `Engine` per model it
steps (the model, or an ensemble's members stepped on the same batch and combined by the
compiled `combine`).

Our engine computes exactly what it is fed, so a return computes only its suffix, and a
sequence keeps its KV blocks until it is freed (a departed request stays pending; the
`rematch` baselines free it at the departure instead: `NativeWriter.free`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.protocol.step import StepTensors
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model, quant_options
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.subserver.setup import LoadedWriter, SubserverSpec
from tokenrouter.runtime.subserver.step import Decision, RowFacts, row_tensors, sample_and_route

log = logging.getLogger(__name__)


class NativeWriter:
    """`WriterEngine` on tokenrouter's engine: a model, or an ensemble's members stepped on
    the same batch and combined by the compiled `combine`."""

    def __init__(self, writer: str, members: tuple[str, ...], engines: dict, router, phase_s: dict[str, float]):
        self.writer, self.members = writer, tuple(members)
        self.engines = {m: engines[m] for m in self.members}
        self.ensemble = self.members != (writer,)
        self.router = router
        self.phase_s = phase_s  # the caller's step-phase counters, added to here
        first = self.engines[self.members[0]]
        self.max_model_len = min(e.max_model_len for e in self.engines.values())
        self.vocab_size = first.config.vocab_size
        self.block_size = first.block_size
        self.blocks_total = min(e.blocks_total for e in self.engines.values())
        self.computed_tokens = 0
        self.items: list = []

    def kv_usage(self) -> tuple[int, int]:
        return (sum(e.blocks_used for e in self.engines.values()),
                sum(e.blocks_total for e in self.engines.values()))

    def refuses(self, r: Request) -> str | None:
        return None

    def fed(self, r: Request) -> int:
        return self.engines[self.members[0]].seq_len(r.seq)

    def feed(self, reqs: list[Request]) -> int:
        self.items = [(r.seq, r.state.tokens[self.fed(r):]) for r in reqs]
        if not all(e.can_append(self.items) for e in self.engines.values()):
            raise RuntimeError(f"{self.writer}: KV cache full for a batch of {len(self.items)}")
        n = sum(len(t) for _, t in self.items)
        self.computed_tokens += n  # our engine computes exactly what it is fed
        return n

    def step(self, reqs: list[Request]) -> list[Decision | None]:
        t0 = time.perf_counter()
        outs = [self.engines[m].step(self.items, self.router.needs) for m in self.members]
        self.phase_s["forward"] += time.perf_counter() - t0
        rows = [RowFacts.of(r) for r in reqs]
        if not self.ensemble:
            return sample_and_route(self.router, outs[0].logits, rows, hidden=outs[0].hidden,
                                    embed=self.engines[self.writer].embed, phase_s=self.phase_s)
        positions, visit, seeds = row_tensors(rows)
        member_logits = tuple(o.logits for o in outs)
        logits = self.router.combine(StepTensors(logits=None, sampled=None, visit_tokens=visit, position=positions,
                                                 request_seed=seeds, member_logits=member_logits))
        return sample_and_route(self.router, logits, rows, member_logits=member_logits, phase_s=self.phase_s)

    def can_fork(self) -> bool:
        return all(e.can_fork() for e in self.engines.values())

    def fork(self, parent: Request, child: Request, n_tokens: int) -> None:
        """`child`'s KV in every member: `parent`'s first n_tokens, shared (`Engine.fork`)."""
        for e in self.engines.values():
            e.fork(parent.seq, child.seq, n_tokens)

    def park(self, r: Request) -> None:
        """Nothing to do: the sequence keeps its blocks until it is freed."""

    def release(self, r: Request) -> None:
        self.free(r.seq)

    def between_layers(self, hook) -> None:
        for e in self.engines.values():
            e.model.between_layers = hook

    def free(self, seq) -> None:
        """Free one engine sequence in every member (also for the `rematch` baselines' cache)."""
        for e in self.engines.values():
            e.free(seq)



def load_writer(spec: SubserverSpec, phase_s: dict[str, float], models: dict[str, Any] | None = None) -> LoadedWriter:
    """The writer's program, router and `NativeWriter` (`models`: preloaded weights, by
    model name; `phase_s`: the step-phase counters its engine adds to)."""
    program = ir.Program.from_json(spec.program_json)
    ens = next((e for e in program.ensembles if e.name == spec.writer), None)
    members = ens.members if ens else (spec.writer,)
    dtype = getattr(torch, program.model(members[0]).dtype)
    router = load_routers(program, device=spec.device, dtype=dtype, base_dir=spec.base_dir)[spec.writer]
    engines = {}
    for name in members:
        pm = program.model(name)
        mdt = getattr(torch, pm.dtype)
        t0 = time.monotonic()
        log.info("loading %s (%s, quant %s)", pm.path, pm.dtype, pm.quant)
        m = (models or {}).get(name) or load_model(pm.path, dtype=mdt, quant=pm.quant)
        engines[name] = Engine(m.config, m.weights, quant_options(
            m, pm.quant, device=spec.device, dtype=mdt, block_size=spec.block_size, num_blocks=spec.num_blocks,
            max_model_len=spec.max_model_len))
        log.info("%s (quant %s) loaded in %.1f s", pm.path, pm.quant, time.monotonic() - t0)
    return LoadedWriter(program, tuple(members), router, NativeWriter(spec.writer, members, engines, router, phase_s))


