"""`VllmWriter`: the `WriterEngine` of a writer served by vLLM, and `load_vllm_writer`,
this engine's `load_writer` (what such a writer's subserver loads).

Each request is one resumable vLLM request under the request's id. Its `fed` is what
vLLM's KV holds, kept as our engine keeps it: after each step, every token the request
had before the step's commit. A request vLLM still steps (it stayed) needs nothing fed:
vLLM computes the token it sampled. One that is new here or back from a peer gets a
chunk, `tokens[fed:]`; vLLM computes only that chunk (the token this writer kept at its
handoff, which vLLM dropped when the chunk ended, then the peers' suffix). A chunk never
takes a request to vLLM's context limit (the subserver refuses it first; vLLM's engine
would die of it).

The chunk's vLLM sampling is greedy with the park token as its one stop id (EOS
ignored, no length limit of its own): the processor (`processor.py`) does the real
sampling and the end rules, and forces the token vLLM takes; the decision comes back
with it (`codes.py`). A chunk that ends leaves the request parked in vLLM with its KV;
a release aborts it, which frees the blocks.

KV: vLLM's blocks (a multiple of 32 tokens on CPU) are reported in the launch's block
size, so the frontend's admission counts them like the other writers' blocks. A request
reserves ceil(n / b) + 1 of those, which covers vLLM's ceil(n / B) blocks of B tokens while
B <= 2b (checked at load). Parked
requests hold their blocks and vLLM never preempts them, so admission must keep the
cache from filling (it reserves each request's blocks before it starts). The steps'
computed tokens come from vLLM's own scheduler (`computed_tokens`), the proof that a
return computes only its suffix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.runtime.loader import checkpoint_folder
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.subserver.setup import LoadedWriter, SubserverSpec
from tokenrouter.runtime.subserver.step import Decision
from tokenrouter.runtime.vllm import codes
from tokenrouter.runtime.vllm.engine import EngineConfig, Shape, start_engine, vllm_block_size


@dataclass
class Seq:
    fed: int = 0  # tokens in vLLM's KV
    running: bool = False  # vLLM steps it: its chunk was added and has not ended
    awaiting: bool = False  # its chunk was added and has given no token yet (vLLM feeds it over steps)


def park_token(shape: Shape, vocab_size: int) -> int:
    """The stop id that ends a chunk: the model's BOS, which it writes mid-text rarely (if
    it does, the decision says the token is real and the next chunk feeds it)."""
    bos = shape.bos_token_id
    return bos if isinstance(bos, int) and 0 <= bos < vocab_size else 0


class VllmWriter:
    def __init__(self, engine, writers: int, park: int, unit: int, phase_s: dict[str, float]):
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs.engine import tokens_input

        self.engine, self.core = engine, engine.engine_core
        self.tokens_input, self.sampling = tokens_input, VllmSampling
        self.tasks = engine.get_supported_tasks()
        self.pool = self.core.engine_core.scheduler.kv_cache_manager.block_pool
        self.writers, self.park_token, self.phase_s = writers, park, phase_s
        self.max_model_len = engine.model_config.max_model_len
        self.vocab_size = engine.model_config.get_vocab_size()
        self.vllm_block = engine.vllm_config.cache_config.block_size
        self.block_size = unit
        self.blocks_total = (self.pool.num_gpu_blocks - 1) * self.vllm_block // unit  # less vLLM's null block
        self.seqs: dict[str, Seq] = {}
        self.computed_tokens = 0  # vLLM's count of the tokens its steps computed
        self.used = 0

    def between_layers(self, hook) -> None:
        """vLLM's CPU worker binds its own threads: nothing to re-read."""

    def kv_usage(self) -> tuple[int, int]:
        return self.used, self.blocks_total

    def warm_up(self) -> None:
        """One plain request of a few tokens, before serving: vLLM's first steps pay one-time
        costs (seconds), which would otherwise fall on the first request."""
        sp = self.sampling(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)
        req = self.engine.input_processor.process_inputs("warm-up", self.tokens_input([self.park_token] * 8), sp,
                                                         supported_tasks=self.tasks)
        self.core.add_request(req)
        while not any(o.request_id == "warm-up" and o.finish_reason for o in self.core.get_output().outputs):
            pass
        self.count_used()

    def refuses(self, r: Request) -> str | None:
        """The processor sees only where a chunk started, not the request's tokens, and its
        decision takes the place of vLLM's logprobs: so no penalties, logit bias,
        structured output or logprobs here yet."""
        p = r.params
        if p.processes_logits or p.logprobs is not None:
            return ("a writer served by vLLM does not apply penalties, logit_bias, min_tokens, structured "
                    "output or logprobs yet")
        return None

    def fed(self, r: Request) -> int:
        s = self.seqs.get(r.rid)
        return s.fed if s else 0

    def feed(self, reqs: list[Request]) -> int:
        n = 0
        for r in reqs:
            s = self.seqs.setdefault(r.rid, Seq())
            tokens = r.state.tokens
            if s.awaiting:  # vLLM is still computing its chunk
                continue
            n += len(tokens) - s.fed
            if s.running:
                if len(tokens) - s.fed != 1:
                    raise RuntimeError(f"{r.rid}: vLLM runs it, but {len(tokens) - s.fed} tokens are unseen")
                continue
            if len(tokens) >= self.max_model_len:  # vLLM's engine dies of a chunk past its context
                raise ValueError(f"{r.rid}: {len(tokens)} tokens do not fit vLLM's context of {self.max_model_len}")
            self.add_chunk(r, tokens[s.fed:])
            s.running = s.awaiting = True
        return n

    def add_chunk(self, r: Request, chunk: list[int]) -> None:
        sp = self.sampling(temperature=0.0, max_tokens=self.max_model_len, stop_token_ids=[self.park_token],
                           ignore_eos=True, logprobs=0, detokenize=False, skip_special_tokens=False,
                           extra_args=codes.chunk_args(r))
        req = self.engine.input_processor.process_inputs(r.rid, self.tokens_input(list(chunk)), sp,
                                                         supported_tasks=self.tasks, resumable=True)
        self.core.add_request(req)

    def step(self, reqs: list[Request]) -> list[Decision | None]:
        t0 = time.perf_counter()
        out = self.core.get_output()
        self.phase_s["forward"] += time.perf_counter() - t0  # sampling and routing included
        details = out.scheduler_stats.iteration_details if out.scheduler_stats else None
        if details is not None:
            self.computed_tokens += details.num_ctx_tokens + details.num_generation_tokens
        got = {o.request_id: o for o in out.outputs}
        decisions: list[Decision | None] = []
        for r in reqs:
            o = got.pop(r.rid, None)
            if o is None or not o.new_token_ids:  # vLLM has not finished feeding it yet
                if o is not None and o.finish_reason is not None:
                    raise RuntimeError(f"{r.rid}: vLLM ended it ({o.finish_reason}) without a token")
                decisions.append(None)
                continue
            s = self.seqs[r.rid]
            s.fed = len(r.state.tokens)
            s.running, s.awaiting = o.finish_reason is None, False
            decisions.append((*codes.decode(float(o.new_logprobs.logprobs[-1][0]), self.writers), None))
        for rid, o in got.items():  # stepped outside the batch: never, while a batch is every ready request
            if o.new_token_ids and rid in self.seqs:
                self.abort(rid)
        self.count_used()
        return decisions

    def park(self, r: Request) -> None:
        """A request that stops here while vLLM still steps it (it failed) is aborted there."""
        s = self.seqs.get(r.rid)
        if s is not None and s.running:
            self.abort(r.rid)

    def release(self, r: Request) -> None:
        if r.rid in self.seqs:
            self.abort(r.rid)

    def abort(self, rid: str) -> None:
        """Forget `rid` in vLLM, freeing its blocks (a later feed would start it afresh)."""
        del self.seqs[rid]
        self.core.abort_requests([rid])
        self.count_used()

    def count_used(self) -> None:
        free = self.pool.get_num_free_blocks()
        self.used = (self.pool.num_gpu_blocks - 1 - free) * self.vllm_block // self.block_size


def load_vllm_writer(spec: SubserverSpec, phase_s: dict[str, float], models: dict[str, Any] | None = None) -> LoadedWriter:
    """The writer's program, router (its send and receive) and a started `VllmWriter`."""
    program = ir.Program.from_json(spec.program_json)
    m = program.model(spec.writer)
    router = load_routers(program, device="cpu", dtype=torch.float32, base_dir=spec.base_dir)[spec.writer]
    _, folder = checkpoint_folder(m.path)
    shape = Shape.of(folder)
    writers = program.writers()
    if not codes.fits(shape.vocab_size, len(writers)):
        raise ValueError(f"{spec.writer}: a vocabulary of {shape.vocab_size} and {len(writers)} writers do not fit "
                         "the decision codes")
    park = park_token(shape, shape.vocab_size)
    route = {"program": spec.program_json, "writer": spec.writer, "base_dir": spec.base_dir, "park_token": park}
    if vllm_block_size(spec.block_size) > 2 * spec.block_size:  # see VllmWriter: admission would under-count
        raise ValueError(f"{spec.writer}: vLLM's KV blocks here are {vllm_block_size(spec.block_size)} tokens; "
                         f"launch with a block size of at least {vllm_block_size(spec.block_size) // 2}")
    engine = start_engine(EngineConfig(
        folder, m.dtype, m.tensor_parallel, spec.max_model_len,
        kv_tokens=spec.num_blocks * spec.block_size if spec.num_blocks else None,
        max_num_seqs=spec.max_batch, block_size=spec.block_size, route=route))
    writer = VllmWriter(engine, len(writers), park, spec.block_size, phase_s)
    writer.warm_up()
    return LoadedWriter(program, (spec.writer,), router, writer)
