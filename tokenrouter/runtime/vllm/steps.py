"""What the tuner times of a writer served by vLLM (`tuner/steps.py`): its steps as its
subserver runs them, a `StepRunner` over a `VllmWriter` (started by `load_vllm_writer`), so a
step is vLLM's engine-core step with our logits processor sampling and routing in it."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from tokenrouter.compiler import ir
from tokenrouter.protocol.sampling import MAX_TOKENS, SamplingParams
from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.subserver.setup import SubserverSpec
from tokenrouter.runtime.subserver.step import StepRunner
from tokenrouter.runtime.vllm.writer import load_vllm_writer

BLOCK = 16  # tokens per KV block, as the launch's default


class VllmSteps:
    """A vLLM writer's steps, as its subserver runs them: each sequence is one of our
    requests (its rid the sequence's name), fed by `VllmWriter.feed` and stepped by a
    `StepRunner`, whose commit follows the program's route decisions.

    vLLM computes a request it still runs (its route kept it here) from the token it
    sampled: a step feeds such a sequence one token, that one (not the one given). Any other sequence is
    parked in vLLM (or new) and its tokens come as a chunk (`VllmWriter.add_chunk`): the
    prompt, or a return's suffix (the token this writer kept, if it did, then the given
    tokens up to `len(tokens)` unseen ones). A chunk of more than one token ends after its
    first token (its `max_tokens`, by the processor's end rules), so the next step's tokens
    come as a returning chunk again, as in serving: an extend of k tokens per request is a
    step of returning chunks of k tokens. A chunk vLLM feeds over several steps (a batch
    past its tokens per step) is stepped until every sequence has its token."""

    def __init__(self, program: ir.Program, writer: str, max_len: int, max_batch: int):
        blocks = max_batch * (math.ceil(max_len / BLOCK) + 2)  # vLLM's blocks of 32 on CPU: up to one more each
        spec = SubserverSpec(program_json=program.to_json(indent=None), writer=writer, addresses={},
                             block_size=BLOCK, num_blocks=blocks, max_model_len=max_len, max_batch=max_batch)
        phase_s: dict[str, float] = defaultdict(float)
        loaded = load_vllm_writer(spec, phase_s)
        self.writer, self.engine = writer, loaded.engine
        self.runner = StepRunner(writer, loaded.program.writers(), loaded.engine, phase_s)
        self.vocab_size = loaded.engine.vocab_size
        self.reqs: dict[object, Request] = {}
        self.running: set[object] = set()  # vLLM steps them on: each step's token is the one it sampled

    def step(self, batch: list[tuple[object, list[int]]]) -> None:
        reqs = []
        for seq, tokens in batch:
            r = self.reqs.get(seq)
            if r is None:
                r = self.reqs[seq] = Request(RouteState(str(seq), list(tokens), len(tokens), self.writer), seq,
                                             SamplingParams())
            elif seq in self.running:
                if len(tokens) != 1:
                    raise ValueError(f"{seq}: vLLM runs it, so a step feeds it one token, not {len(tokens)}")
            else:
                st = r.state
                st.tokens.extend(tokens[len(st.tokens) - self.engine.fed(r):])
                st.writer = self.writer
            if seq not in self.running:  # a chunk of several tokens ends after one: the next is a chunk too
                ends = r.n_out + 1 if len(tokens) > 1 else MAX_TOKENS
                r.params = r.state.sampling = r.params.replace(max_tokens=ends)
            reqs.append(r)
        while reqs:
            res = self.runner.run(reqs)
            if res.error is not None:
                raise res.error
            if res.looped or res.failed:
                raise RuntimeError(f"{self.writer}: the profile's step left requests unstepped "
                                   f"({[r.rid for r in res.looped]} looped, {res.failed} failed)")
            for r in res.stepped:
                if r in res.stayed:
                    self.running.add(r.seq)
                elif r not in res.deferred:
                    self.running.discard(r.seq)
            reqs = res.deferred

    def free(self, seq) -> None:
        r = self.reqs.pop(seq, None)
        if r is not None:
            self.engine.release(r)
        self.running.discard(seq)

    def seq_len(self, seq) -> int:
        r = self.reqs.get(seq)
        return self.engine.fed(r) if r is not None else 0


def profile_steps(program: ir.Program, model: ir.Model, threads: int, max_len: int, max_batch: int):
    """(steps, vocabulary size) of `model` (vLLM's CPU worker binds its own threads; torch's
    get `threads`)."""
    if threads > 0:
        torch.set_num_threads(threads)
    steps = VllmSteps(program, model.name, max_len, max_batch)
    return steps, steps.vocab_size
