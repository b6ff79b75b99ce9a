"""Measuring a profile on the real engines: step latency against batch size, alone and
co-located, for every model of a program.

Alone: the model's engine runs decode steps (one token per request) for each batch size,
and we keep the median of a few timed steps. Co-located: the same, while another
process runs the other model's decode steps back to back on the same cores (what a
second subserver does), so the profile carries the slowdown 1 + c the tuner needs.
Extends of k tokens per request are measured alone when asked.

Each model is timed on the engine that serves it, through `steps.py` (one timing loop,
one implementation of its step/free/seq_len per engine): tokenrouter's `Engine`, or, for
`engine = vllm`, its `VllmWriter` stepped by a `StepRunner` as its subserver steps it
(vLLM's step with our logits processor sampling and routing; an extend is a step of
returning chunks). A model whose engine is one per process (vLLM's: its capabilities,
`tokenrouter/engines.py`) is timed in a process of its own (`_measure_apart`), and the
other process of a co-located measurement may be on either engine.

Models that share the host's cores in serving (`runtime/cores.py`: every local writer on
an engine that steps on torch threads, without fixed `threads`) are timed sharing them the same way: each
model is measured in a process of its own started with the subservers' OpenMP setting
(`cores.SPIN_ENV`), both processes hold a byte of one cores' ledger, so a step alone runs
on every core and a step beside the other model's on its share, as in serving.

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
import random
import statistics
import time
from dataclasses import asdict

import torch
from tqdm import tqdm

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.runtime.cores import SPIN_ENV, CoreShare, Ledger, LedgerSpec, environment, host_cores
from tokenrouter.tuner.profile import Curve, ModelProfile, Profile, machine_info, timestamp
from tokenrouter.tuner.steps import open_steps

PROMPT = 16
BG_CONTEXT = 256


def _time_steps(steps, vocab: int, batch: int, tokens: int, warmup: int, repeats: int, tag: str) -> float:
    rng = random.Random(batch * 7919 + tokens)
    ids = [(tag, batch, i) for i in range(batch)]
    steps.step([(s, [rng.randrange(vocab) for _ in range(PROMPT)]) for s in ids])
    times = []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        steps.step([(s, [rng.randrange(vocab) for _ in range(tokens)]) for s in ids])
        if r >= warmup:
            times.append((time.perf_counter() - t0) * 1000.0)
    for s in ids:
        steps.free(s)
    return statistics.median(times)


class SharedSteps:
    """A model's steps holding its share of the cores while each runs (`runtime/cores.py`)."""

    def __init__(self, steps, share: CoreShare):
        self.steps, self.share = steps, share

    def step(self, batch) -> None:
        with self.share.stepping():
            self.steps.step(batch)

    def free(self, seq) -> None:
        self.steps.free(seq)

    def seq_len(self, seq) -> int:
        return self.steps.seq_len(seq)


def _open(program: ir.Program, name: str, threads: int, max_len: int, max_batch: int, ledger: dict | None):
    steps, vocab = open_steps(program, program.model(name), threads, max_len, max_batch)
    return (SharedSteps(steps, CoreShare(LedgerSpec(**ledger))) if ledger else steps), vocab


def _background(program_json: str, name: str, threads: int, ready, run, stop, ledger: dict | None = None) -> None:
    """Another model stepping back to back (batch 1 decode) while `run` is set, until `stop`."""
    program = ir.Program.from_json(program_json)
    steps, vocab = _open(program, name, threads, BG_CONTEXT + PROMPT + 8, 1, ledger)
    n = 0
    steps.step([("bg", [1] * PROMPT)])
    ready.set()
    while not stop.is_set():
        if not run.wait(0.05):
            continue
        steps.step([("bg", [n % vocab])])
        n += 1
        if steps.seq_len("bg") > BG_CONTEXT:
            steps.free("bg")
            steps.step([("bg", [1] * PROMPT)])


def _paired_slowdown(steps, vocab: int, batch: int, warmup: int, repeats: int, run) -> float:
    """Median over rounds of (step with the other model running) / (step with it paused)."""
    ratios = []
    for r in range(repeats):
        run.clear()
        time.sleep(0.1)  # the other model finishes its current step (the warm-up steps absorb the rest)
        alone = _time_steps(steps, vocab, batch, 1, warmup, 1, f"pa{r}")
        run.set()
        co = _time_steps(steps, vocab, batch, 1, warmup, 1, f"pc{r}")
        ratios.append(co / alone)
    run.clear()
    return statistics.median(ratios)


#: Extend lengths timed by default: a request returning to a model feeds what the other
#: wrote meanwhile (about 1/p tokens), so the chain needs extend times, not only decodes.
DEFAULT_EXTEND_TOKENS = (4, 16)


def _measure_model(program: ir.Program, name: str, other: str | None, batch_sizes, extend_tokens, repeats: int,
                   warmup: int, threads: dict[str, int], progress: bool,
                   ledger: dict[str, dict] | None = None) -> ModelProfile:
    """Model `name`'s curves: decodes and extends alone, then decodes paired with `other`
    stepping in another process (None: not co-located). `ledger`: the cores' ledger
    (`cores.LedgerSpec` as a dict, per model) when the two share the cores."""
    ledger = ledger or {}
    m = program.model(name)
    max_len = PROMPT + warmup + repeats + max([1, *extend_tokens]) * (warmup + repeats) + 8
    total = len(batch_sizes) * (1 + (other is not None) + len(extend_tokens))
    bar = tqdm(total=total, desc=f"profiling {name}", unit="point", disable=not progress)
    try:
        steps, vocab = _open(program, name, threads[name], max_len, max(batch_sizes), ledger.get(name))
        alone, co, ext = [], [], {}
        for b in batch_sizes:
            bar.set_postfix_str(f"b={b} alone")
            alone.append(_time_steps(steps, vocab, b, 1, warmup, repeats, "alone"))
            bar.update()
        for k in extend_tokens:
            ms = []
            for b in batch_sizes:
                bar.set_postfix_str(f"b={b} extend {k}")
                ms.append(_time_steps(steps, vocab, b, k, warmup, repeats, f"ext{k}"))
                bar.update()
            ext[k] = Curve(tuple(batch_sizes), tuple(ms))
        if other is not None:
            ctx = mp.get_context("spawn")
            ready, run, stop = ctx.Event(), ctx.Event(), ctx.Event()
            proc = ctx.Process(target=_background, daemon=True,
                               args=(program.to_json(indent=None), other, threads[other], ready, run, stop,
                                     ledger.get(other)))
            with environment(SPIN_ENV if ledger else {}):
                proc.start()
            try:
                deadline = time.monotonic() + 900
                while not ready.wait(0.2):
                    if not proc.is_alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"the co-located {other} did not start")
                for b, ms in zip(batch_sizes, alone):
                    bar.set_postfix_str(f"b={b} with {other}")
                    co.append(ms * _paired_slowdown(steps, vocab, b, warmup, repeats, run))
                    bar.update()
            finally:
                stop.set()
                proc.join(60)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
    finally:
        bar.close()
    return ModelProfile(name, Curve(tuple(batch_sizes), tuple(alone)),
                        Curve(tuple(batch_sizes), tuple(co)) if co else None, ext, m.path, threads[name], m.engine)


def _measure_child(send, program_json: str, name: str, kwargs: dict) -> None:
    try:
        send.send(("ok", _measure_model(ir.Program.from_json(program_json), name, **kwargs)))
    except Exception as exc:  # the parent raises it, with the model's name
        send.send(("error", f"{type(exc).__name__}: {exc}"))


def _measure_apart(program: ir.Program, name: str, env: dict[str, str] | None = None, **kwargs) -> ModelProfile:
    """`_measure_model` in a process of its own, started with `env` in its environment: for
    a model served by vLLM (vLLM's engine whose worker runs in its caller's process, as in a
    subserver, is one per process, for the process's life, and its CPU worker binds that
    process's threads to its cores), and for models sharing the cores (OpenMP reads its
    wait policy when the process starts)."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_measure_child, args=(send, program.to_json(indent=None), name, kwargs))
    with environment(env or {}):
        proc.start()
    send.close()
    try:
        kind, value = recv.recv()
    except EOFError:
        kind, value = "error", f"its process ended with exit code {proc.exitcode}"
    finally:
        proc.join(120)
        if proc.is_alive():
            proc.terminate()
            proc.join()
    if kind == "error":
        raise RuntimeError(f"profiling {name} failed: {value}")
    return value


def measure_profile(program, batch_sizes, *, extend_tokens=DEFAULT_EXTEND_TOKENS, colocate: bool = True,
                    repeats: int = 5, warmup: int = 2, threads: dict[str, int] | None = None, progress: bool = True,
                    source: str = "", share: bool = True) -> Profile:
    """A `Profile` of `program`'s models on this machine, each timed on the engine that serves
    it, with the cores shared as serving shares them (`share`; `threads` fixes a model's)."""
    models = list(program.models)
    fixed = {**dict(program.schedule.threads), **dict(threads or {})}
    sharing = [m.name for m in models
               if not fixed.get(m.name) and engines.capabilities(m.engine).shares_cores] if share else []
    cores = host_cores()
    threads = {m.name: fixed.get(m.name) or (cores if m.name in sharing or not share
                                             else max(1, cores // max(1, len(models)))) for m in models}
    ledger = Ledger(sharing, cores) if len(sharing) > 1 else None
    others = len(models) > 1 and colocate
    out = {}
    try:
        for m in models:
            kwargs = dict(other=next(o.name for o in models if o.name != m.name) if others else None,
                          batch_sizes=list(batch_sizes), extend_tokens=list(extend_tokens), repeats=repeats,
                          warmup=warmup, threads=threads, progress=progress,
                          ledger={w: asdict(ledger.spec(w)) for w in sharing} if ledger else None)
            if engines.capabilities(m.engine).one_per_process or m.name in sharing:
                out[m.name] = _measure_apart(program, m.name, env=SPIN_ENV if m.name in sharing else None, **kwargs)
            else:
                out[m.name] = _measure_model(program, m.name, **kwargs)
    finally:
        if ledger is not None:
            ledger.close()
    info = machine_info()
    info.update({"torch": torch.__version__, "device": "cpu", "torch_threads_default": torch.get_num_threads(),
                 "co_located_with": (f"another process decoding batch 1 back to back (contexts up to {BG_CONTEXT}); "
                                     "slowdown timed in pairs, paused/running") if others else None,
                 "cores": ("shared by need (runtime/cores.py) among " + ", ".join(sharing)) if sharing else "fixed",
                 "repeats": repeats, "prompt_tokens": PROMPT})
    return Profile(out, info, timestamp(), source)
