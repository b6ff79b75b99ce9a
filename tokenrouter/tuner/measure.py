"""Measuring a profile with the real engine: step latency against batch size, alone and
co-located, for every model of a program.

Alone: the model's engine runs decode steps (one token per request) for each batch size,
and we keep the median of a few timed steps. Co-located: the same, while another
process runs the other model's decode steps back to back on the same cores (what a
second subserver does), so the profile carries the slowdown 1 + c the tuner needs.
Extends of k tokens per request are measured alone when asked.

The slowdown is measured in pairs: for each batch size, timed steps alternate between
the other process paused and running, and the profile keeps alone x the median ratio.
This machine's speed drifts by tens of percent over minutes (other tenants); timing the
co-located curve in one block after the alone one put the large model's slowdown at
1.3x-2.0x in three runs five minutes apart; paired, three runs put it at 1.0-1.1x,
as a direct side-by-side check does. The other process decodes at short contexts (as
served requests do), restarting its sequence every `BG_CONTEXT` tokens.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import statistics
import time

import torch
from tqdm import tqdm

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model, quant_options

from tokenrouter.tuner.profile import Curve, ModelProfile, Profile, machine_info, timestamp

PROMPT = 16
BG_CONTEXT = 256


def served_engine(path: str, dtype_name: str, threads: int, max_len: int, quant: str = "none"):
    """The model as its subserver holds it: its dtype and its weight format (`quant`, with the
    kernel plan cached for it), so the profile times the steps serving will run."""
    if threads > 0:
        torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    m = load_model(path, dtype=dtype, quant=quant)
    return (Engine(m.config, m.weights, quant_options(m, quant, dtype=dtype, max_model_len=max_len, num_blocks=None)),
            m.config.vocab_size)


def _time_steps(engine, vocab: int, batch: int, tokens: int, warmup: int, repeats: int, tag: str) -> float:
    rng = random.Random(batch * 7919 + tokens)
    ids = [(tag, batch, i) for i in range(batch)]
    engine.step([(s, [rng.randrange(vocab) for _ in range(PROMPT)]) for s in ids])
    times = []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        engine.step([(s, [rng.randrange(vocab) for _ in range(tokens)]) for s in ids])
        if r >= warmup:
            times.append((time.perf_counter() - t0) * 1000.0)
    for s in ids:
        engine.free(s)
    return statistics.median(times)


def _background(path: str, dtype: str, threads: int, ready, run, stop, quant: str = "none") -> None:
    """Another model stepping back to back (batch 1 decode) while `run` is set, until `stop`."""
    engine, vocab = served_engine(path, dtype, threads, BG_CONTEXT + PROMPT + 8, quant)
    n = 0
    engine.step([("bg", [1] * PROMPT)])
    ready.set()
    while not stop.is_set():
        if not run.wait(0.05):
            continue
        engine.step([("bg", [n % vocab])])
        n += 1
        if engine.seq_len("bg") > BG_CONTEXT:
            engine.free("bg")
            engine.step([("bg", [1] * PROMPT)])


def _paired_slowdown(engine, vocab: int, batch: int, warmup: int, repeats: int, run) -> float:
    """Median over rounds of (step with the other model running) / (step with it paused)."""
    ratios = []
    for r in range(repeats):
        run.clear()
        time.sleep(0.1)  # the other model finishes its current step (the warm-up steps absorb the rest)
        alone = _time_steps(engine, vocab, batch, 1, warmup, 1, f"pa{r}")
        run.set()
        co = _time_steps(engine, vocab, batch, 1, warmup, 1, f"pc{r}")
        ratios.append(co / alone)
    run.clear()
    return statistics.median(ratios)


#: Extend lengths timed by default: a request returning to a model feeds what the other
#: wrote meanwhile (about 1/p tokens), so the chain needs extend times, not only decodes.
DEFAULT_EXTEND_TOKENS = (4, 16)


def measure_profile(program, batch_sizes, *, extend_tokens=DEFAULT_EXTEND_TOKENS, colocate: bool = True,
                    repeats: int = 5, warmup: int = 2, threads: dict[str, int] | None = None, progress: bool = True,
                    source: str = "") -> Profile:
    """A `Profile` of `program`'s models on this machine."""
    models = list(program.models)
    threads = dict(threads or {})
    default_threads = max(1, (os.cpu_count() or 1) // max(1, len(models)))
    sched_threads = dict(program.schedule.threads)
    for m in models:
        threads.setdefault(m.name, sched_threads.get(m.name) or default_threads)
    max_len = PROMPT + warmup + repeats + max([1, *extend_tokens]) * (warmup + repeats) + 8
    others = len(models) > 1 and colocate
    total = len(models) * len(batch_sizes) * (1 + others) + len(models) * len(batch_sizes) * len(extend_tokens)
    bar = tqdm(total=total, desc="profiling", unit="point", disable=not progress)
    out = {}
    ctx = mp.get_context("spawn")
    try:
        for m in models:
            engine, vocab = served_engine(m.path, m.dtype, threads[m.name], max_len, m.quant)
            alone, co, ext = [], [], {}
            for b in batch_sizes:
                bar.set_postfix_str(f"{m.name} b={b} alone")
                alone.append(_time_steps(engine, vocab, b, 1, warmup, repeats, "alone"))
                bar.update()
            for k in extend_tokens:
                ms = []
                for b in batch_sizes:
                    bar.set_postfix_str(f"{m.name} b={b} extend {k}")
                    ms.append(_time_steps(engine, vocab, b, k, warmup, repeats, f"ext{k}"))
                    bar.update()
                ext[k] = Curve(tuple(batch_sizes), tuple(ms))
            if others:
                other = next(o for o in models if o.name != m.name)
                ready, run, stop = ctx.Event(), ctx.Event(), ctx.Event()
                proc = ctx.Process(target=_background,
                                   args=(other.path, other.dtype, threads[other.name], ready, run, stop, other.quant),
                                   daemon=True)
                proc.start()
                try:
                    deadline = time.monotonic() + 600
                    while not ready.wait(0.2):
                        if not proc.is_alive() or time.monotonic() > deadline:
                            raise RuntimeError(f"the co-located {other.name} did not start")
                    for b, ms in zip(batch_sizes, alone):
                        bar.set_postfix_str(f"{m.name} b={b} with {other.name}")
                        co.append(ms * _paired_slowdown(engine, vocab, b, warmup, repeats, run))
                        bar.update()
                finally:
                    stop.set()
                    proc.join(60)
                    if proc.is_alive():
                        proc.terminate()
                        proc.join()
            out[m.name] = ModelProfile(m.name, Curve(tuple(batch_sizes), tuple(alone)),
                                       Curve(tuple(batch_sizes), tuple(co)) if co else None, ext, m.path,
                                       threads[m.name])
            del engine
    finally:
        bar.close()
    info = machine_info()
    info.update({"torch": torch.__version__, "device": "cpu", "torch_threads_default": torch.get_num_threads(),
                 "co_located_with": (f"another process decoding batch 1 back to back (contexts up to {BG_CONTEXT}); "
                                     "slowdown timed in pairs, paused/running") if others else None,
                 "repeats": repeats, "prompt_tokens": PROMPT})
    return Profile(out, info, timestamp(), source)
