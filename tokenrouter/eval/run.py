"""Run one configuration (a program) over the evaluation prompts through the offline API.

Greedy decoding (with the task set's stop strings), so a configuration's outputs do not depend on the batch layout or the
concurrency (the runtime's differential tests prove that); only `tokens_per_s` does. The
deployment is started, warmed up with one short request, timed over all prompts at the
given concurrency, and stopped, so start-up and weight conversion are not in the figure.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Sequence

from tokenrouter.compiler import ir
from tokenrouter.eval.configs import EvalError
from tokenrouter.eval.taskset import spread
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.loader import resolve_folder
from tokenrouter.runtime.offline import LLM

log = logging.getLogger(__name__)


@dataclass
class ConfigRun:
    """The outputs of one configuration (in prompt order) and its throughput: `wall_s` at the
    first concurrency, `rates` tokens/s at each concurrency run, `consistent` whether every
    concurrency produced the same tokens (greedy decoding must)."""

    label: str
    outputs: list  # list[RequestOutput]
    wall_s: float
    rates: dict = field(default_factory=dict)
    consistent: bool = True
    verdicts: list = field(default_factory=list)  # taskset.Verdict per output, once judged

    @property
    def tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def encode_prompts(tokenizer, messages: Sequence[str], chat: bool = True, response_prefix: str = "") -> list[list[int]]:
    """Token ids of every prompt: each message as a user message in the model's chat template
    followed by `response_prefix` (the start of the assistant's turn) when `chat` and the
    tokenizer has a template, else the raw message and prefix."""
    use_chat = chat and bool(getattr(tokenizer, "chat_template", None))
    out = []
    for m in messages:
        if use_chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True)
            out.append(tokenizer.encode(text + response_prefix, add_special_tokens=False))
        else:
            out.append(tokenizer.encode(m + response_prefix))
    return out


def context_length(program: ir.Program, max_model_len: int | None = None) -> int:
    """The longest sequence every model of the program serves (as the subservers compute it),
    read from the models' config.json without loading weights."""
    lengths = []
    for m in program.models:
        _, folder = resolve_folder(m.path)
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            lengths.append(int(json.load(f).get("max_position_embeddings") or 0) or 1 << 30)
    limit = min(lengths)
    return min(limit, max_model_len) if max_model_len else limit


def check_fit(tasks: Sequence, ids: list[list[int]], limit: int) -> None:
    """Every prompt must leave room for at least one output token."""
    for t, p in zip(tasks, ids):
        if len(p) >= limit:
            raise EvalError(f"prompt {t.id!r} has {len(p)} tokens; the models' context holds {limit} "
                            f"(prompt and output together)")


def speed_subset(n_prompts: int, speed_prompts: int | None) -> list[int]:
    """The prompts (indices, evenly spread) the concurrencies after the first are timed on:
    all of them, or `speed_prompts` of them."""
    return spread(list(range(n_prompts)), speed_prompts or n_prompts)


def run_program(program: ir.Program, label: str, ids: list[list[int]], tasks: Sequence, max_tokens: int,
                concurrency: list[int], launch=None, use_tqdm: bool = True, stop: Sequence[str] = (),
                speed_prompts: int | None = None) -> ConfigRun:
    """Serve `program`, generate greedily for every prompt at the first concurrency and for
    `speed_subset` at each other one, in turn (one deployment, so the rates see the same
    start-up and load), stop. Raises EvalError if any request failed (nothing is reported
    from a partial run)."""
    opts = dataclasses.replace(launch or LaunchOptions(), concurrency=max(concurrency))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=tuple(stop))
    runs = []
    log.info("%s: starting its subservers", label)
    with LLM(program, launch=opts) as llm:
        log.info("%s: warming up with one short request", label)
        llm.generate([ids[0]], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
        subset = speed_subset(len(ids), speed_prompts)
        for k, c in enumerate(concurrency):
            which = list(range(len(ids))) if k == 0 else subset
            t0 = time.perf_counter()
            outs = llm.generate([ids[i] for i in which], params, concurrency=c, use_tqdm=use_tqdm,
                                desc=f"{label}, concurrency {c}")
            runs.append((c, which, outs, time.perf_counter() - t0))
            for i, o in zip(which, outs):
                if o.finish_reason == "error":
                    raise EvalError(f"{label}: prompt {tasks[i].id!r} failed: {o.error}")
    first = runs[0][2]
    rates = {c: sum(len(o.token_ids) for o in outs) / wall if wall > 0 else 0.0 for c, _, outs, wall in runs}
    consistent = all([o.token_ids for o in outs] == [first[i].token_ids for i in which] for _, which, outs, _ in runs)
    return ConfigRun(label, first, runs[0][3], rates, consistent)
