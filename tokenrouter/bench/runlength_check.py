"""Run lengths of a real R-Stitch run, fitted, and the tuner's predictions against the
measured throughput of the runtime (`tokenrouter bench runlength-check`).

1. generate on the lockstep baseline and record every request's visits (`runlengths.py`);
2. fit them (`tuner.runlength.fit`: geometric mixtures, BIC) and save the traces;
3. measure the runtime's throughput at concurrency N with the large model's B fixed;
4. predict that throughput with the chain from the profile, once with geometric run
   lengths of the measured means and once with the fitted phase-type distributions, and
   once with the simulator fed the observed lengths; give each one's error.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.launch import LaunchOptions, batch_thresholds
from tokenrouter.runtime.loader import model_facts
from tokenrouter.runtime.loader import program_tokenizer
from tokenrouter.tuner import api, simulate
from tokenrouter.tuner.program import inputs_from_program
from tokenrouter.tuner.runlength import PhaseType, fit, save_traces

from tokenrouter.bench import configs as C
from tokenrouter.bench import results as R
from tokenrouter.bench import tuning, workload
from tokenrouter.bench.deploy import RuntimeDeployment
from tokenrouter.bench.runlengths import collect


@dataclass
class CheckOptions:
    file: str
    concurrency: int = 8
    requests: int = 16
    max_tokens: int = 64
    batch: int | None = None  # B of the large model (default: the launcher's)
    rounds: int = 2
    profile: str | None = None
    out: str = "bench-results/runlengths"


def runlength_check(opts: CheckOptions) -> dict[str, Any]:
    """Run the check and write `runlength_check.json` (and the traces, and the profile when
    it was measured here) into `opts.out`; return what it wrote."""
    program = load_program(opts.file, model_facts=model_facts)
    _, large = C.small_and_large(program)  # also refuses a program without exactly two models
    tok = program_tokenizer(program)
    ids = [tok.encode(p) for p in workload.prompts(opts.requests)]
    os.makedirs(opts.out, exist_ok=True)
    t0 = time.time()
    print("collecting run lengths on the lockstep baseline ...", file=sys.stderr, flush=True)
    complete, last, _ = collect(program, ids, opts.max_tokens, opts.concurrency, threads=os.cpu_count() or 1)
    save_traces(os.path.join(opts.out, "runlengths.json"), complete)
    fits = {m: fit(v) for m, v in complete.items() if v}
    geo = {m: PhaseType.geometric(1.0 / float(np.mean(v))) for m, v in complete.items() if v}
    print(f"  {time.time() - t0:.0f} s", file=sys.stderr)

    profile = tuning.load_or_measure(program, opts.profile, max(8, opts.concurrency), 3, True, opts.file)
    if not opts.profile:
        profile.save(os.path.join(opts.out, "profile.json"))
    writers = C.writers(program)
    batch = batch_thresholds(program, writers, opts.concurrency)
    if opts.batch:
        batch[large] = opts.batch
    dep = RuntimeDeployment(program, LaunchOptions(mode="process", concurrency=opts.concurrency, num_blocks=512))
    try:
        dep.measure("warmup", ids[:2], workload.sampling(4), 2)
        ms = [dep.measure("tokenrouter", ids, workload.sampling(opts.max_tokens), opts.concurrency, batch)
              for _ in range(opts.rounds)]
    finally:
        dep.close()
    measured = R.config_result(ms)
    pi = inputs_from_program(program)
    sys_kw = dict(models=pi.models, start=pi.start, rewrite=pi.rewrite, batch=batch, max_wait_ms=pi.max_wait_ms)
    preds = {}
    for name, rl in (("geometric", geo), ("phase_type", fits)):
        system = api.build_system(profile, opts.concurrency, None, rl, **sys_kw)
        p = api.predict(system)
        preds[name] = {"tokens_per_s": p.throughput, "method": p.method}
    system = api.build_system(profile, opts.concurrency, None, fits, **sys_kw)
    sim = simulate.simulate(system, tokens=50_000, observed=complete)
    preds["simulated_observed"] = {"tokens_per_s": sim.throughput, "ci95": sim.ci95, "method": "simulation"}
    x = measured["tokens_per_s"]
    for p in preds.values():
        p["error_vs_measured"] = p["tokens_per_s"] / x - 1
    doc = {"program": opts.file, "concurrency": opts.concurrency, "requests": opts.requests,
           "max_tokens": opts.max_tokens, "batch": batch, "measured": measured,
           "runlengths": {m: {"count": len(v), "mean": float(np.mean(v)), "max": int(max(v)),
                              "geometric": geo[m].to_dict(), "fitted": fits[m].to_dict()}
                          for m, v in complete.items() if v},
           "truncated_last_runs": {m: len(v) for m, v in last.items()},
           "predictions": preds, "profile": tuning.slowdown_summary(profile), "elapsed_s": time.time() - t0}
    R.write_json(os.path.join(opts.out, "runlength_check.json"), doc)
    return doc
