"""Run every configuration side by side: start each deployment once, then, per
concurrency level, measure them in interleaved rounds (the order rotates each round) so
machine noise hits them alike; report the median round and ratios from the same run.

`run_bench` runs one function a step: `_prepare` (the program, the prompts, the profile
and each level's tuned B_i, the deployments' sizes), `_start_shared` (the deployments that
live for the whole run, and their warm-up), `_measure_levels` (per level, `_measure_level`:
the per-level llama.cpp peers, the calibration wave, the rounds; a level that fails is
recorded in `failed_levels` and the next one runs), then `details` and `level_doc`
assemble details.json and `results.summary` the summary. Writing the files is the
command's (`commands/bench.py`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from tokenrouter.compiler.pipeline import load_program, with_quant
from tokenrouter.runtime.host import host_info, load_average
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.loader import checkpoint_folder, model_facts, resolve_folder
from tokenrouter.runtime.loader import program_tokenizer

from tokenrouter.bench import configs as C
from tokenrouter.bench import results as R
from tokenrouter.bench import tuning, workload
from tokenrouter.bench.deploy import LockstepDeployment, RuntimeDeployment
from tokenrouter.bench.llamacpp import LlamaCppLarge, LlamaCppStandard, peer_gguf
from tokenrouter.bench.official import CiterOfficial
from tokenrouter.bench.vllm_peers import VllmLarge, VllmStandard
from tokenrouter.bench.documents import details, level_doc
from tokenrouter.bench.state import Measured, Setup, swept_batch


@dataclass
class BenchOptions:
    file: str
    concurrency: list[int]
    requests: int = 16  # per measurement, at least 2 N (see workload.requests_for)
    max_tokens: int = 64
    rounds: int = 3
    configs: list[str] = field(default_factory=lambda: list(C.CONFIGS))
    sweep: list[int] = field(default_factory=list)  # levels at which to sweep B of the large model
    profile: str | None = None
    profile_repeats: int = 3
    num_blocks: int | None = None
    progress: bool = True
    model_paths: dict[str, str] | None = None
    params: dict[str, str] | None = None  # --set NAME=VALUE
    quant: list[str] | None = None  # `--quant Q` / `NAME=Q` items (compiler.pipeline.with_quant)
    threads: int = 1  # threads of lockstep, a single-model server, llamacpp_large and official
    out_dir: str | None = None  # where to save the measured profile
    mode: str = "process"  # "thread": subservers in this process (tests)
    steady_s: float = 0.0  # size each configuration's measurement for at least this many seconds
    max_requests_waves: int = 8  # ... but at most this many waves of N requests
    # waves of N requests for `official`, whose large model recomputes every prefix, so its cost
    # grows with the square of the output length (--long: 1; None: as many as the others)
    official_waves: int | None = None
    llama_server: str | None = None  # a llama-server built on this host for the llama.cpp peers (None: the wheel's)
    prompts: str | None = None  # a .jsonl of {"prompt": ...} asked through the chat template (None: workload.prompts)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _deployment_key(config: str) -> str:
    return "routed" if config in ("tokenrouter", "no_delay") or config.startswith("tokenrouter@") else config


def num_blocks_for(opts: BenchOptions, prompt_len: int, block_size: int = 16) -> int:
    """KV blocks for the largest level with room for the prefix cache of `rematch`."""
    per = -(-(prompt_len + opts.max_tokens) // block_size) + 1
    return opts.num_blocks or max(256, 3 * per * max(opts.concurrency))


def calibrated_requests(base: int, concurrency: int, max_tokens: int, tokens_per_s: float, steady_s: float,
                        cap: int) -> int:
    """Requests for one configuration's measurement. Without calibration (steady_s = 0):
    `base`, at least two waves of N. With it: enough whole waves of N for `steady_s`
    seconds at the configuration's calibrated speed, between one wave and `cap`, so a fast
    configuration runs long enough to reach its steady state and a slow one (whose single
    wave already lasts that long) is not made to run for many minutes."""
    if steady_s <= 0 or tokens_per_s <= 0:
        return workload.requests_for(concurrency, base)
    n = math.ceil(steady_s * tokens_per_s / max_tokens)
    n = -(-n // concurrency) * concurrency
    return max(concurrency, min(n, cap))


def official_requests(requests: int, concurrency: int, waves: int | None) -> int:
    """`official`'s share of a measurement: at most `waves` whole waves of N (None: all of them).
    At 2,048 tokens one wave of 8 took over 35 minutes (measured), so --long runs one."""
    return requests if waves is None else min(requests, max(1, waves) * concurrency)


def _start(c: str, opts: BenchOptions, setup: Setup, n: int):
    """A running deployment of configuration c (n: the level, for the per-level peers)."""
    program, base, ctx, small, large = setup.program, setup.base, setup.ctx, setup.small, setup.large
    cores = os.cpu_count() or 1
    if c == "lockstep":
        return LockstepDeployment(program, threads=opts.threads, num_blocks=base.num_blocks)
    if c in ("large_only", "small_only"):
        one = C.single_model(program, large if c == "large_only" else small)
        return RuntimeDeployment(one, dataclasses.replace(base, threads={one.start: opts.threads}))
    if c == "official":
        return CiterOfficial(program, threads=opts.threads)
    if C.config_engine(c) is not None:
        return RuntimeDeployment(C.on_engine(program, large, C.config_engine(c)), base)
    if c == "vllm_large":
        m = program.model(large)
        return VllmLarge(checkpoint_folder(m.path)[1], m.dtype, opts.threads, max(256, ctx), max(opts.concurrency))
    if c == "vllm_std":
        return VllmStandard(program, {m.name: checkpoint_folder(m.path)[1] for m in program.models}, max(256, ctx),
                            max(opts.concurrency), _vocab(program))
    if c in C.PER_LEVEL:
        if c == "llamacpp_large":
            m = program.model(large)
            return LlamaCppLarge(peer_gguf(m), parallel=n, threads=opts.threads, ctx_per_slot=ctx,
                                 binary=opts.llama_server)
        ggufs = {m.name: peer_gguf(m) for m in program.models}
        per = max(1, cores // len(program.models))
        return LlamaCppStandard(program, ggufs, parallel=n, threads={m.name: per for m in program.models},
                                ctx_per_slot=ctx, vocab=_vocab(program), binary=opts.llama_server)
    return RuntimeDeployment(program, C.launch_options(c, program, base))


def _vocab(program) -> int:
    sizes = set()
    for m in program.models:
        with open(os.path.join(resolve_folder(m.path)[1], "config.json")) as f:
            sizes.add(int(json.load(f)["vocab_size"]))
    if len(sizes) != 1:
        raise ValueError(f"the models' vocabularies differ in size ({sorted(sizes)})")
    return sizes.pop()


def run_bench(opts: BenchOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns (details, summary)."""
    setup = _prepare(opts)
    cores = os.cpu_count() or 1
    deployments: dict[str, Any] = {}
    try:
        _start_shared(deployments, setup, opts)
        measured = _measure_levels(deployments, setup, opts)
    finally:
        _close_all(deployments)
        torch.set_num_threads(cores)
    doc = details(opts, setup, measured, cores)
    levels_doc = {n: level_doc(n, measured, setup, opts) for n in measured.raw}
    doc["levels"] = {str(n): lv for n, lv in levels_doc.items()}
    doc["elapsed_s"] = time.time() - setup.started
    return doc, R.summary(levels_doc)


def _prepare(opts: BenchOptions) -> Setup:
    """Load the program and encode the prompts; then (on the run's clock) read or measure
    the profile when a configuration needs it, save it under `out_dir`, and tune each
    level's B_i."""
    program = with_quant(load_program(opts.file, model_paths=opts.model_paths, params=opts.params,
                                        model_facts=model_facts), opts.quant)
    small, large = C.small_and_large(program)
    writers = C.writers(program)
    tok = program_tokenizer(program)
    levels = sorted(set(opts.concurrency))
    cap = {n: max(workload.requests_for(n, opts.requests), opts.max_requests_waves * n) for n in levels}
    count = max(cap.values())
    texts = workload.chat_prompts(opts.prompts, tok, count) if opts.prompts else workload.prompts(count)
    ids = [tok.encode(p) for p in texts]
    sampling = workload.sampling(opts.max_tokens)
    started = time.time()
    measured = [c for c in opts.configs if c not in C.DERIVED]

    auto = [w for w, v in program.schedule.batch if v == "auto"] or [w for w in writers if w != program.start]
    profile = None
    if (any(c in opts.configs for c in ("tokenrouter", "no_pending")) and auto) or "bound" in opts.configs:
        _log("profile: " + (opts.profile or "measuring the models' step times (alone and co-located)"))
        profile = tuning.load_or_measure(program, opts.profile, max(levels), opts.profile_repeats, opts.progress,
                                         opts.file)
    if profile is not None and opts.out_dir:
        os.makedirs(opts.out_dir, exist_ok=True)
        profile.save(os.path.join(opts.out_dir, "profile.json"))
    tuned = {n: (tuning.tuned_thresholds(program, n, profile) if profile is not None and auto
                 else {w: 1 for w in writers}) for n in levels}

    prompt_len = max(len(x) for x in ids)
    blocks = num_blocks_for(opts, prompt_len)
    ctx = prompt_len + opts.max_tokens + 16
    base = LaunchOptions(mode=opts.mode, concurrency=max(levels), num_blocks=blocks)
    return Setup(program, small, large, writers, levels, cap, ids, sampling, measured, auto, profile, tuned, blocks,
                  ctx, base, started)


def _start_shared(deployments: dict[str, Any], setup: Setup, opts: BenchOptions) -> None:
    """Start the deployments that live for the whole run into `deployments` (each as it
    starts, so the caller closes whichever did), then warm each up: first steps, allocator,
    code paths."""
    for c in setup.measured:
        key = _deployment_key(c)
        if key in deployments or c in C.PER_LEVEL:
            continue
        _log(f"starting {key} ...")
        deployments[key] = _start(c, opts, setup, max(setup.levels))
    if opts.sweep and "routed" not in deployments:
        deployments["routed"] = _start("tokenrouter", opts, setup, max(setup.levels))
    for key, d in deployments.items():
        d.measure(key, setup.ids[:2], workload.sampling(4), 2)


def _close_all(deployments: dict[str, Any]) -> None:
    for d in deployments.values():
        try:
            d.close()
        except Exception as exc:  # a deployment that fails to stop must not hide the results
            _log(f"warning: closing a deployment failed: {exc}")


def _plan(setup: Setup, opts: BenchOptions) -> list[tuple[int, list[str]]]:
    """(level, the configurations measured there): the sweep's tokenrouter@B at --sweep levels."""
    plan = []
    for n in setup.levels:
        names = list(setup.measured)
        if n in opts.sweep:
            tb = setup.tuned[n].get(setup.large, 1)
            names += [f"tokenrouter@{b}" for b in tuning.sweep_candidates(n, tb)]
        plan.append((n, names))
    return plan


def _measure_levels(deployments: dict[str, Any], setup: Setup, opts: BenchOptions) -> Measured:
    plan = _plan(setup, opts)
    out = Measured()
    total = sum(len(names) for _, names in plan) * opts.rounds
    bar = tqdm(total=total, desc="bench", unit="run", disable=not opts.progress)
    try:
        for n, names in plan:
            _measure_level(n, names, deployments, setup, opts, out, bar)
    finally:
        bar.close()
    return out


def _measure_level(n: int, names: list[str], deployments: dict[str, Any], setup: Setup, opts: BenchOptions,
                   out: Measured, bar) -> None:
    """Level `n` into `out`: start its per-level peers, calibrate, run the rounds. A level that
    fails (a peer server dying, say) is reported in `out.failed`; the others still run."""
    level_deps: dict[str, Any] = {}
    try:
        _start_level(level_deps, n, names, setup, opts)
        out.builds.update({c: d.build for c, d in level_deps.items() if getattr(d, "build", None)})
        out.ggufs.update({c: d.ggufs for c, d in level_deps.items() if getattr(d, "ggufs", None)})
        deps = {c: level_deps[c] if c in level_deps else deployments[_deployment_key(c)] for c in names}
        out.requests[n] = {}
        _calibrate(out.requests[n], n, names, deps, setup, opts)
        out.load[n] = {"before": load_average()}
        out.raw[n] = _rounds(n, names, deps, out.requests[n], setup, opts, bar)
        out.load[n]["after"] = load_average()
    except Exception as exc:  # whatever a peer raised (an HTTP client's ReadError too): the other levels keep theirs
        out.failed[n] = f"{type(exc).__name__}: {exc}"
        _log(f"level N={n} failed, its figures are dropped: {out.failed[n]}")
        out.raw.pop(n, None)
    finally:
        for d in level_deps.values():
            d.close()


def _start_level(level_deps: dict[str, Any], n: int, names: list[str], setup: Setup, opts: BenchOptions) -> None:
    """Start and warm up the peers started once per level (`--parallel N`) into `level_deps`."""
    for c in names:
        if c in C.PER_LEVEL:
            _log(f"starting {c} (--parallel {n}) ...")
            level_deps[c] = _start(c, opts, setup, n)
            level_deps[c].measure(c, setup.ids[:2], workload.sampling(4), 2)


def _calibrate(requests: dict[str, int], n: int, names: list[str], deps: dict[str, Any], setup: Setup,
               opts: BenchOptions) -> None:
    """Fill `requests` with each configuration's requests at level `n`: with steady_s, sized
    by the faster of two waves of requests as long as the measured ones, up to 128 tokens
    (see calibrated_requests). Quarter-length waves ran slower than the measurement's
    (their prefills weigh more), which sized 128-token measurements meant for 30 s at 23-27 s."""
    cal_tokens = min(opts.max_tokens, 128)
    for c in names:
        tps = 0.0
        if opts.steady_s > 0:  # two waves: the first may pay one-time costs (a vLLM engine's first steps)
            tps = max(deps[c].measure(c, setup.ids[:n], workload.sampling(cal_tokens), n,
                                      setup.batch_of(c, n)).tokens_per_s for _ in range(2))
        requests[c] = calibrated_requests(opts.requests, n, opts.max_tokens, tps, opts.steady_s, setup.cap[n])
        if c == "official":
            requests[c] = official_requests(requests[c], n, opts.official_waves)


def _rounds(n: int, names: list[str], deps: dict[str, Any], requests: dict[str, int], setup: Setup,
            opts: BenchOptions, bar) -> dict[str, list]:
    """The interleaved rounds at level `n`, the order rotating each round: configuration -> measurements."""
    raw: dict[str, list] = {c: [] for c in names}
    for r in range(opts.rounds):
        k = r % len(names)
        for c in names[k:] + names[:k]:
            bar.set_postfix_str(f"N={n} round {r + 1} {c}")
            if opts.progress:  # a line as each measurement starts and ends: each runs for tens of seconds
                tqdm.write(f"N={n}, round {r + 1} of {opts.rounds}: {c}, {requests[c]} requests ...", file=sys.stderr)
            m = deps[c].measure(c, setup.ids[:requests[c]], setup.sampling, n, setup.batch_of(c, n))
            raw[c].append(m)
            if opts.progress:
                tqdm.write(f"N={n}, round {r + 1} of {opts.rounds}: {c}: {m.tokens_per_s:.1f} tok/s in "
                           f"{m.wall_s:.0f} s", file=sys.stderr)
            bar.update()
    return raw
