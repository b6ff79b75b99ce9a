"""This runtime against its baselines, side by side in one run, on the same prompts.

    .venv/bin/python benchmarks/runtime_baselines.py [--concurrency 8] [--requests 16] [--max-tokens 64] [--rounds 3]

Configurations (greedy, same program, same prompts; all deployments stay up and are measured
in alternation, --rounds times, and the median round is reported):
  tokenrouter   async subservers, pending handoffs, delayed batching (B_i from the schedule)
  no-delay      the same with B_i = 1 everywhere
  naive         independent servers + a dispatcher re-sending the context (baselines/naive.py)
  lockstep      both models stepped together in one loop (baselines/lockstep.py)
Reports committed tokens/s, ratios to each baseline, the share of tokens each model wrote,
and the small model's per-step time breakdown (forward, sample, routing, scheduling, cache
bookkeeping, messaging). Writes JSON and a PNG plot to --out (default bench-results/).
All outputs of all configurations are checked to be identical (a schedule never changes
tokens), so the comparison is like for like.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from tokenrouter.runtime.loader import model_facts

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _prompts(n: int) -> list[str]:
    topics = ["the history of the printing press", "how vaccines train the immune system",
              "why the sky is blue", "the rules of chess", "how a compiler works", "the water cycle",
              "the causes of inflation", "how bees communicate", "the theory of plate tectonics",
              "how a transistor works", "the life of a star", "how to bake bread"]
    return [f"Write a short explanation of {topics[i % len(topics)]} (variant {i})." for i in range(n)]


class RuntimeConfig:
    """A deployment kept running across rounds, so configurations alternate in time and
    drift in the machine's load hits all of them alike."""

    def __init__(self, name, program, opts):
        from tokenrouter.runtime.offline import LLM
        self.name = name
        self.llm = LLM(program, launch=opts)

    def measure(self, prompts, params, concurrency):
        llm = self.llm
        llm.generate(prompts[:2], params, use_tqdm=False, ignore_eos=True)  # warm-up
        before = llm.stats()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, concurrency=concurrency, use_tqdm=False, ignore_eos=True)
        wall = time.perf_counter() - t0
        after = llm.stats()
        tokens = sum(len(o.token_ids) for o in outs)
        phases, steps = {}, {}
        for w in after:
            phases[w] = {k: after[w]["phase_s"][k] - before[w]["phase_s"][k] for k in after[w]["phase_s"]}
            steps[w] = after[w]["steps"] - before[w]["steps"]
        batch = {w: (after[w]["batch_size"]["sum"] - before[w]["batch_size"]["sum"]) / max(1, steps[w])
                 for w in after}
        return {"name": self.name, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
                "written_by": _sum_by_model(outs), "phase_s": phases, "steps": steps, "mean_batch": batch,
                "batch_threshold": {w: after[w]["batch_threshold"] for w in after},
                "threads": {w: after[w]["threads"] for w in after},
                "outputs": [o.token_ids for o in outs]}

    def close(self):
        self.llm.close()


class LockstepConfig:
    name = "lockstep"

    def __init__(self, program, tokenizer, threads):
        from tokenrouter.runtime.baselines.lockstep import Lockstep
        self.ls = Lockstep(program, threads=threads, num_blocks=512)
        self.tok = tokenizer

    def measure(self, prompts, params, concurrency):
        ls = self.ls
        ids = [self.tok.encode(p) for p in prompts]
        ls.generate(ids[:2], params, concurrency=concurrency)  # warm-up
        ls.phase_s = {k: 0.0 for k in ls.phase_s}
        t0 = time.perf_counter()
        outs = ls.generate(ids, params, concurrency=concurrency)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outs)
        return {"name": "lockstep", "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
                "written_by": _sum_by_model(outs), "phase_s": {"all": dict(ls.phase_s)}, "steps": {},
                "outputs": [o.token_ids for o in outs]}

    def close(self):
        pass


def _sum_by_model(outs):
    tot = {}
    for o in outs:
        for k, v in (o.tokens_by_model if hasattr(o, "tokens_by_model") else {}).items():
            tot[k] = tot.get(k, 0) + v
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default=os.path.join(ROOT, "examples", "bench.route"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-results"))
    ap.add_argument("--only", default=None, help="comma-separated subset of configurations")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    args = ap.parse_args(argv)

    import torch

    from tokenrouter.compiler.pipeline import load_program
    from tokenrouter.runtime.baselines.naive import naive_options, no_delay_options
    from tokenrouter.runtime.engine.sampler import SamplingParams
    from tokenrouter.runtime.launch import LaunchOptions, batch_thresholds, served_writers
    from tokenrouter.runtime.loader import program_tokenizer

    program = load_program(args.program, model_facts=model_facts)
    tokenizer = program_tokenizer(program)
    prompts = _prompts(args.requests)
    params = SamplingParams(max_tokens=args.max_tokens)
    cores = os.cpu_count() or 1
    base = LaunchOptions(mode="process", concurrency=args.concurrency, num_blocks=512)
    only = set(args.only.split(",")) if args.only else None
    configs = [("tokenrouter", base), ("no-delay", no_delay_options(program, base)),
               ("naive", naive_options(program, base))]
    running = []
    try:
        for name, opts in configs:
            if not only or name in only:
                print(f"starting {name} ...", file=sys.stderr, flush=True)
                running.append(RuntimeConfig(name, program, opts))
        if not only or "lockstep" in only:
            running.append(LockstepConfig(program, tokenizer, cores))
        rounds: dict[str, list] = {c.name: [] for c in running}
        for k in range(args.rounds):
            for c in running:  # alternate the configurations within each round
                print(f"round {k + 1}/{args.rounds}: {c.name}", file=sys.stderr, flush=True)
                rounds[c.name].append(c.measure(prompts, params, args.concurrency))
    finally:
        for c in running:
            c.close()
    torch.set_num_threads(cores)
    # per configuration: the median round by throughput (its breakdown comes with it)
    results = []
    for name, rs in rounds.items():
        rs = sorted(rs, key=lambda r: r["tokens_per_s"])
        med = dict(rs[len(rs) // 2])
        med["rounds_tokens_per_s"] = [r["tokens_per_s"] for r in rounds[name]]
        med["outputs_all_rounds_equal"] = all(r["outputs"] == rs[0]["outputs"] for r in rs)
        results.append(med)

    same = all(r["outputs"] == results[0]["outputs"] and r["outputs_all_rounds_equal"] for r in results)
    by = {r["name"]: r for r in results}
    small = program.start
    report = {"program": os.path.relpath(args.program, ROOT), "concurrency": args.concurrency,
              "requests": args.requests, "max_tokens": args.max_tokens, "cores": cores,
              "thresholds": batch_thresholds(program, served_writers(program), args.concurrency),
              "identical_outputs": same, "results": [{k: v for k, v in r.items() if k != "outputs"} for r in results]}
    if "tokenrouter" in by:
        t = by["tokenrouter"]["tokens_per_s"]
        report["speedup"] = {n: t / r["tokens_per_s"] for n, r in by.items() if n != "tokenrouter"}
    breakdown = {}
    for n, r in by.items():
        ph = r["phase_s"].get(small)
        if ph:
            steps = max(1, r["steps"].get(small, 1))
            total = sum(ph.values())
            breakdown[n] = {k: {"ms_per_step": 1000 * v / steps, "share": v / total if total else 0.0}
                            for k, v in ph.items()}
    report["small_model_step_breakdown"] = breakdown

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "runtime_baselines.json"), "w") as f:
        json.dump(report, f, indent=2)
    _plot(report, os.path.join(args.out, "runtime_baselines.png"))

    print(f"\n{args.requests} requests x {args.max_tokens} tokens, concurrency {args.concurrency}, "
          f"{cores} cores; identical outputs: {same}")
    for r in results:
        rs = ", ".join(f"{x:.1f}" for x in r["rounds_tokens_per_s"])
        print(f"  {r['name']:<12} {r['tokens_per_s']:8.1f} tokens/s (rounds: {rs})   written by {r['written_by']}")
    for n, s in report.get("speedup", {}).items():
        print(f"  tokenrouter / {n:<10} {s:5.2f}x")
    for n, b in breakdown.items():
        print(f"  {n} small-model step: " + ", ".join(f"{k} {v['ms_per_step']:.2f} ms ({100 * v['share']:.0f}%)"
                                                  for k, v in b.items()))
    return 0 if same else 1


def _plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = report["results"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar([r["name"] for r in res], [r["tokens_per_s"] for r in res], color="tab:blue")
    a.set_ylabel("tokens / s")
    a.set_title(f"concurrency {report['concurrency']}, {report['requests']} requests")
    names = list(report["small_model_step_breakdown"])
    bottom = [0.0] * len(names)
    phases = ["schedule", "forward", "sample", "route", "bookkeeping", "messaging"]
    for p in phases:
        vals = [report["small_model_step_breakdown"][n].get(p, {}).get("ms_per_step", 0.0) for n in names]
        b.bar(names, vals, bottom=bottom, label=p)
        bottom = [x + y for x, y in zip(bottom, vals)]
    b.set_ylabel("ms per small-model step")
    b.legend(fontsize=8)
    b.set_title("small model: per-step time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
