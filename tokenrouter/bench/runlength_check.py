"""Run lengths of a real R-Stitch run, fitted, and the tuner's predictions against the
measured throughput of the runtime.

    python -m tokenrouter.bench.runlength_check [examples/demo.route] [--concurrency 8]
        [--requests 16] [--max-tokens 64] [--batch 4] [--profile FILE] [--out DIR]

1. generate on the lockstep baseline and record every request's visits (`runlengths.py`);
2. fit them (`tuner.runlength.fit`: geometric mixtures, BIC) and save the traces;
3. measure the runtime's throughput at concurrency N with the large model's B fixed;
4. predict that throughput with the chain from the profile, once with geometric run
   lengths of the measured means and once with the fitted phase-type distributions, and
   once with the simulator fed the observed lengths; print each one's error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    from tokenrouter.commands.bench import default_program
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=os.path.join(os.path.dirname(default_program()), "demo.route"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=None, help="B of the large model (default: the launcher's)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--out", default="bench-out/runlengths")
    args = ap.parse_args(argv)

    import numpy as np

    from tokenrouter.compiler.pipeline import load_program
    from tokenrouter.runtime.loader import model_facts
    from tokenrouter.runtime.launcher import LaunchOptions, batch_thresholds
    from tokenrouter.runtime.offline import tokenizer_for
    from tokenrouter.tuner import api, simulate
    from tokenrouter.tuner.program import inputs_from_program
    from tokenrouter.tuner.runlength import PhaseType, fit, save_traces

    from . import configs as C
    from . import results as R
    from . import tuning, workload
    from .deploy import RuntimeDeployment
    from .runlengths import collect

    program = load_program(args.file, model_facts=model_facts)
    small, large = C.small_and_large(program)
    tok = tokenizer_for(program)
    ids = [tok.encode(p) for p in workload.prompts(args.requests)]
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    print("collecting run lengths on the lockstep baseline ...", file=sys.stderr, flush=True)
    complete, last, _ = collect(program, ids, args.max_tokens, args.concurrency, threads=os.cpu_count() or 1)
    save_traces(os.path.join(args.out, "runlengths.json"), complete)
    fits = {m: fit(v) for m, v in complete.items() if v}
    geo = {m: PhaseType.geometric(1.0 / float(np.mean(v))) for m, v in complete.items() if v}
    print(f"  {time.time() - t0:.0f} s", file=sys.stderr)

    profile = tuning.load_or_measure(program, args.profile, max(8, args.concurrency), 3, True, args.file)
    if not args.profile:
        profile.save(os.path.join(args.out, "profile.json"))
    writers = C.writers(program)
    batch = batch_thresholds(program, writers, args.concurrency)
    if args.batch:
        batch[large] = args.batch
    dep = RuntimeDeployment(program, LaunchOptions(mode="process", concurrency=args.concurrency, num_blocks=512))
    try:
        dep.measure("warmup", ids[:2], workload.sampling(4), 2)
        ms = [dep.measure("tokenrouter", ids, workload.sampling(args.max_tokens), args.concurrency, batch)
              for _ in range(args.rounds)]
    finally:
        dep.close()
    measured = R.config_result(ms)
    pi = inputs_from_program(program)
    sys_kw = dict(models=pi.models, start=pi.start, rewrite=pi.rewrite, batch=batch, max_wait_ms=pi.max_wait_ms)
    preds = {}
    for name, rl in (("geometric", geo), ("phase_type", fits)):
        system = api.build_system(profile, args.concurrency, None, rl, **sys_kw)
        p = api.predict(system)
        preds[name] = {"tokens_per_s": p.throughput, "method": p.method}
    system = api.build_system(profile, args.concurrency, None, fits, **sys_kw)
    sim = simulate.simulate(system, tokens=50_000, observed=complete)
    preds["simulated_observed"] = {"tokens_per_s": sim.throughput, "ci95": sim.ci95, "method": "simulation"}
    x = measured["tokens_per_s"]
    for p in preds.values():
        p["error_vs_measured"] = p["tokens_per_s"] / x - 1
    doc = {"program": args.file, "concurrency": args.concurrency, "requests": args.requests,
           "max_tokens": args.max_tokens, "batch": batch, "measured": measured,
           "runlengths": {m: {"count": len(v), "mean": float(np.mean(v)), "max": int(max(v)),
                              "geometric": geo[m].to_dict(), "fitted": fits[m].to_dict()}
                          for m, v in complete.items() if v},
           "truncated_last_runs": {m: len(v) for m, v in last.items()},
           "predictions": preds, "profile": tuning.slowdown_summary(profile), "elapsed_s": time.time() - t0}
    R.write_json(os.path.join(args.out, "runlength_check.json"), doc)
    print(f"\n{args.file}, N = {args.concurrency}, B = {batch}; measured {x:.1f} tok/s "
          f"(rounds {', '.join(f'{r:.1f}' for r in measured['rounds_tokens_per_s'])}), share {measured['share']}")
    for m, d in doc["runlengths"].items():
        print(f"  {m}: {d['count']} runs, mean {d['mean']:.2f}, max {d['max']}, fitted {d['fitted']}")
    for k, p in preds.items():
        print(f"  {k:<20} {p['tokens_per_s']:8.1f} tok/s ({p['method']}): {100 * p['error_vs_measured']:+.1f}% vs measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
