"""Run every configuration side by side: start each deployment once, then, per
concurrency level, measure them in interleaved rounds (the order rotates each round) so
machine noise hits them alike; report the median round and ratios from the same run.
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
from tokenrouter.runtime.frontend.launch import LaunchOptions
from tokenrouter.runtime.loader import model_facts, resolve_folder
from tokenrouter.runtime.loader.gguf_export import exported_gguf
from tokenrouter.runtime.loader import program_tokenizer

from tokenrouter.bench import configs as C
from tokenrouter.bench import results as R
from tokenrouter.bench import tuning, workload
from tokenrouter.bench.deploy import LockstepDeployment, RuntimeDeployment
from tokenrouter.bench.llamacpp import LlamaCppLarge, LlamaCppStandard
from tokenrouter.bench.official import CiterOfficial


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


def _start(c: str, program, opts: BenchOptions, base, n: int, ctx: int, small: str, large: str):
    """A running deployment of configuration c (n: the level, for the per-level peers)."""
    cores = os.cpu_count() or 1
    if c == "lockstep":
        return LockstepDeployment(program, threads=opts.threads, num_blocks=base.num_blocks)
    if c in ("large_only", "small_only"):
        one = C.single_model(program, large if c == "large_only" else small)
        return RuntimeDeployment(one, dataclasses.replace(base, threads={one.start: opts.threads}))
    if c == "official":
        return CiterOfficial(program, threads=opts.threads)
    if c in C.PER_LEVEL:
        if c == "llamacpp_large":
            m = program.model(large)
            return LlamaCppLarge(exported_gguf(m.path), parallel=n, threads=opts.threads, ctx_per_slot=ctx)
        ggufs = {m.name: exported_gguf(m.path) for m in program.models}
        per = max(1, cores // len(program.models))
        return LlamaCppStandard(program, ggufs, parallel=n, threads={m.name: per for m in program.models},
                                ctx_per_slot=ctx, vocab=_vocab(program))
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
    program = with_quant(load_program(opts.file, model_paths=opts.model_paths, params=opts.params,
                                        model_facts=model_facts), opts.quant)
    small, large = C.small_and_large(program)
    writers = C.writers(program)
    tok = program_tokenizer(program)
    levels = sorted(set(opts.concurrency))
    cap = {n: max(workload.requests_for(n, opts.requests), opts.max_requests_waves * n) for n in levels}
    ids = [tok.encode(p) for p in workload.prompts(max(cap.values()))]
    sampling = workload.sampling(opts.max_tokens)
    cores = os.cpu_count() or 1
    t_start = time.time()
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
    deployments: dict[str, Any] = {}
    raw: dict[int, dict[str, list]] = {}
    n_req: dict[int, dict[str, int]] = {}
    load: dict[int, dict[str, Any]] = {}
    failed: dict[int, str] = {}

    def batch_of(c: str, n: int):
        if c.startswith("tokenrouter@"):
            batch = {w: 1 for w in writers}
            batch[large] = int(c.split("@")[1])
            return batch
        return C.thresholds_for(c, program, tuned[n]) if c not in C.PER_LEVEL and c != "official" else None

    try:
        for c in measured:  # the deployments that live for the whole run
            key = _deployment_key(c)
            if key in deployments or c in C.PER_LEVEL:
                continue
            _log(f"starting {key} ...")
            deployments[key] = _start(c, program, opts, base, max(levels), ctx, small, large)
        if opts.sweep and "routed" not in deployments:
            deployments["routed"] = _start("tokenrouter", program, opts, base, max(levels), ctx, small, large)
        for key, d in deployments.items():  # warm-up: first steps, allocator, code paths
            d.measure(key, ids[:2], workload.sampling(4), 2)

        plan = []
        for n in levels:
            names = list(measured)
            if n in opts.sweep:
                tb = tuned[n].get(large, 1)
                names += [f"tokenrouter@{b}" for b in tuning.sweep_candidates(n, tb)]
            plan.append((n, names))
        total = sum(len(names) for _, names in plan) * opts.rounds
        bar = tqdm(total=total, desc="bench", unit="run", disable=not opts.progress)
        try:
            for n, names in plan:
                level_deps = {}
                try:  # a level that fails (a peer server dying, say) is reported; the others still run
                    for c in names:
                        if c in C.PER_LEVEL:
                            _log(f"starting {c} (--parallel {n}) ...")
                            level_deps[c] = _start(c, program, opts, base, n, ctx, small, large)
                            level_deps[c].measure(c, ids[:2], workload.sampling(4), 2)

                    def dep(c):
                        return level_deps[c] if c in level_deps else deployments[_deployment_key(c)]

                    # calibration: one wave of short requests, to size each measurement for steady_s
                    n_req[n] = {}
                    cal_tokens = max(8, opts.max_tokens // 4)
                    for c in names:
                        tps = 0.0
                        if opts.steady_s > 0:
                            cal = dep(c).measure(c, ids[:n], workload.sampling(cal_tokens), n, batch_of(c, n))
                            tps = cal.tokens_per_s
                        n_req[n][c] = calibrated_requests(opts.requests, n, opts.max_tokens, tps, opts.steady_s,
                                                          cap[n])
                        if c == "official":
                            n_req[n][c] = official_requests(n_req[n][c], n, opts.official_waves)
                    load[n] = {"before": load_average()}
                    raw[n] = {c: [] for c in names}
                    for r in range(opts.rounds):
                        k = r % len(names)
                        for c in names[k:] + names[:k]:  # rotate the order each round
                            bar.set_postfix_str(f"N={n} round {r + 1} {c}")
                            m = dep(c).measure(c, ids[:n_req[n][c]], sampling, n, batch_of(c, n))
                            raw[n][c].append(m)
                            bar.update()
                    load[n]["after"] = load_average()
                except (RuntimeError, OSError, TimeoutError, ValueError, ConnectionError) as exc:
                    failed[n] = f"{type(exc).__name__}: {exc}"
                    _log(f"level N={n} failed, its figures are dropped: {failed[n]}")
                    raw.pop(n, None)
                finally:
                    for d in level_deps.values():
                        d.close()
        finally:
            bar.close()
    finally:
        for d in deployments.values():
            try:
                d.close()
            except Exception as exc:  # a deployment that fails to stop must not hide the results
                _log(f"warning: closing a deployment failed: {exc}")
        torch.set_num_threads(cores)

    details = {"program": opts.file, "small": small, "large": large, "cores": cores,
               "host": {**host_info(), "load_average_at_end": load_average()},
               "workload": {"max_tokens": opts.max_tokens, "requests": n_req, "rounds": opts.rounds,
                            "steady_s": opts.steady_s, "sampling": "greedy, stop tokens ignored"},
               "deployment": {"mode": opts.mode, "num_blocks": blocks,
                              "threads": {"routed": "cores / local subservers (1 each on 2 cores)",
                                          "lockstep_and_single_model": opts.threads,
                                          "llamacpp_std": f"{max(1, cores // 2)} per server",
                                          "llamacpp_large_and_official": opts.threads}},
               "profile": tuning.slowdown_summary(profile) if profile is not None else None,
               "elapsed_s": None, "levels": {}, "failed_levels": {str(n): why for n, why in failed.items()}}
    levels_doc = {}
    for n, per in raw.items():
        cfg = {c: R.config_result(ms) for c, ms in per.items() if not c.startswith("tokenrouter@")}
        if "bound" in opts.configs and per.get("tokenrouter"):
            med = R.median_round(per["tokenrouter"])
            b = R.bound(n, profile, med)
            if b and b["tokens_per_s"]:
                cfg["bound"] = {"tokens_per_s": b["tokens_per_s"], "rounds_tokens_per_s": None, "bound": b,
                                "tokenrouter_gap": R.gap(n, profile, med)}
        tps = {c: v["tokens_per_s"] for c, v in cfg.items()}
        lv = {"requests": n_req[n], "batch_thresholds": tuned[n], "configs": cfg, "ratios": R.ratios(tps),
              "of_bound": R.of_bound(tps), "identical_outputs": R.identical_outputs(per),
              "peer_agreement": R.peer_agreement(per), "load_average": load.get(n)}
        if profile is not None and auto:
            lv["predicted"] = {"tokenrouter": tuning.predict(program, profile, n, tuned[n]),
                               "no_delay": tuning.predict(program, profile, n, {w: 1 for w in writers})}
        sw = {c: ms for c, ms in per.items() if c.startswith("tokenrouter@")}
        if sw:
            pts = []
            for c, ms in sorted(sw.items(), key=lambda kv: int(kv[0].split("@")[1])):
                b = int(c.split("@")[1])
                batch = {w: 1 for w in writers}
                batch[large] = b
                pred = tuning.predict(program, profile, n, batch) if profile is not None else None
                res = R.config_result(ms)
                pts.append({"B": b, "tokens_per_s": res["tokens_per_s"], "rounds_tokens_per_s": res["rounds_tokens_per_s"],
                            "predicted_tokens_per_s": (pred or {}).get("tokens_per_s")})
            best = max(pts, key=lambda p: p["tokens_per_s"])
            tuned_pt = next(p for p in pts if p["B"] == tuned[n].get(large, 1))
            lv["sweep"] = {"model": large, "points": pts, "best_measured_B": best["B"], "tuned_B": tuned_pt["B"],
                           "tuned_over_best": tuned_pt["tokens_per_s"] / best["tokens_per_s"]}
        levels_doc[n] = lv
    details["levels"] = {str(n): lv for n, lv in levels_doc.items()}
    details["elapsed_s"] = time.time() - t_start
    return details, R.summary(levels_doc)
