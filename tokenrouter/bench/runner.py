"""Run every configuration side by side: start each deployment once, then, per
concurrency level, measure them in interleaved rounds (the order rotates each round) so
machine noise hits them alike; report the median round and ratios from the same run.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from . import configs as C
from . import results as R
from . import tuning, workload


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
    quant: list[str] | None = None  # `--quant Q` / `NAME=Q` items (commands/_args.with_quant)
    threads: int = 1  # torch threads of lockstep and of a single-model server
    out_dir: str | None = None  # where to save the measured profile
    mode: str = "process"  # "thread": subservers in this process (tests)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _deployment_key(config: str) -> str:
    return "routed" if config in ("tokenrouter", "no_delay") or config.startswith("tokenrouter@") else config


def num_blocks_for(opts: BenchOptions, prompt_len: int, block_size: int = 16) -> int:
    """KV blocks for the largest level with room for the prefix cache of `rematch`."""
    per = -(-(prompt_len + opts.max_tokens) // block_size) + 1
    return opts.num_blocks or max(256, 3 * per * max(opts.concurrency))


def run_bench(opts: BenchOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Returns (details, summary)."""
    import torch
    from tqdm.auto import tqdm

    from tokenrouter.compiler.frontend import load_program
    from tokenrouter.runtime.launcher import LaunchOptions
    from tokenrouter.runtime.offline import tokenizer_for

    from .deploy import LockstepDeployment, RuntimeDeployment

    from tokenrouter.commands._args import with_quant
    program = with_quant(load_program(opts.file, model_paths=opts.model_paths, params=opts.params), opts.quant)
    small, large = C.small_and_large(program)
    writers = C.writers(program)
    tok = tokenizer_for(program)
    levels = sorted(set(opts.concurrency))
    n_req = {n: workload.requests_for(n, opts.requests) for n in levels}
    ids = [tok.encode(p) for p in workload.prompts(max(n_req.values()))]
    sampling = workload.sampling(opts.max_tokens)
    cores = os.cpu_count() or 1
    t_start = time.time()

    auto = [w for w, v in program.schedule.batch if v == "auto"] or [w for w in writers if w != program.start]
    profile = None
    if any(c in opts.configs for c in ("tokenrouter", "no_pending")) and auto:
        _log("profile: " + (opts.profile or "measuring the models' step times (alone and co-located)"))
        profile = tuning.load_or_measure(program, opts.profile, max(levels), opts.profile_repeats, opts.progress,
                                         opts.file)
    if profile is not None and opts.out_dir:
        os.makedirs(opts.out_dir, exist_ok=True)
        profile.save(os.path.join(opts.out_dir, "profile.json"))
    tuned = {n: (tuning.tuned_thresholds(program, n, profile) if profile is not None
                 else {w: 1 for w in writers}) for n in levels}

    blocks = num_blocks_for(opts, max(len(x) for x in ids))
    base = LaunchOptions(mode=opts.mode, concurrency=max(levels), num_blocks=blocks)
    deployments: dict[str, Any] = {}
    try:
        for c in opts.configs:
            key = _deployment_key(c)
            if key in deployments:
                continue
            _log(f"starting {key} ...")
            if c == "lockstep":
                deployments[key] = LockstepDeployment(program, threads=opts.threads, num_blocks=blocks)
            elif c in ("large_only", "small_only"):
                one = C.single_model(program, large if c == "large_only" else small)
                deployments[key] = RuntimeDeployment(one, dataclasses.replace(
                    base, threads={one.start: opts.threads}))
            else:
                deployments[key] = RuntimeDeployment(program, C.launch_options(c, program, base))
        if opts.sweep and "routed" not in deployments:
            deployments["routed"] = RuntimeDeployment(program, base)
        for key, d in deployments.items():  # warm-up: first steps, allocator, code paths
            d.measure(key, ids[:2], workload.sampling(4), 2)

        plan = []
        for n in levels:
            names = list(opts.configs)
            if n in opts.sweep:
                tb = tuned[n].get(large, 1)
                names += [f"tokenrouter@{b}" for b in tuning.sweep_candidates(n, tb)]
            plan.append((n, names))
        total = sum(len(names) for _, names in plan) * opts.rounds
        bar = tqdm(total=total, desc="bench", unit="run", disable=not opts.progress)
        raw: dict[int, dict[str, list]] = {}
        try:
            for n, names in plan:
                raw[n] = {c: [] for c in names}
                for r in range(opts.rounds):
                    k = r % len(names)
                    for c in names[k:] + names[:k]:  # rotate the order each round
                        bar.set_postfix_str(f"N={n} round {r + 1} {c}")
                        if c.startswith("tokenrouter@"):
                            batch = {w: 1 for w in writers}
                            batch[large] = int(c.split("@")[1])
                        else:
                            batch = C.thresholds_for(c, program, tuned[n])
                        m = deployments[_deployment_key(c)].measure(c, ids[:n_req[n]], sampling, n, batch)
                        raw[n][c].append(m)
                        bar.update()
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
               "workload": {"max_tokens": opts.max_tokens, "requests": n_req, "rounds": opts.rounds,
                            "sampling": "greedy, stop tokens ignored"},
               "deployment": {"mode": opts.mode, "num_blocks": blocks,
                              "threads": {"routed": "cores / local subservers (1 each on 2 cores)",
                                          "lockstep_and_single_model": opts.threads}},
               "profile": tuning.slowdown_summary(profile) if profile is not None else None,
               "elapsed_s": None, "levels": {}}
    levels_doc = {}
    for n, per in raw.items():
        cfg = {c: R.config_result(ms) for c, ms in per.items() if not c.startswith("tokenrouter@")}
        tps = {c: v["tokens_per_s"] for c, v in cfg.items()}
        lv = {"requests": n_req[n], "batch_thresholds": tuned[n], "configs": cfg, "ratios": R.ratios(tps),
              "identical_outputs": R.identical_outputs(per)}
        if profile is not None:
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
