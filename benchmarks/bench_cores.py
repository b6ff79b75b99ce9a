"""How co-located writers should share the host's cores: the mechanisms side by side.

    .venv/bin/python benchmarks/bench_cores.py examples/bench.route --set handoff=0 -n 8
    .venv/bin/python benchmarks/bench_cores.py examples/coder/rstitch.route -n 8 --min-s 30 --rounds 2

Configurations (the same program, prompts and greedy tokens; every deployment stays up and
the rounds alternate between them, so drift in the host's load hits all alike):

  small_alone   the program reduced to its small model, on every core
  large_alone   reduced to its large model, on every core
  split         each writer a fixed even share of the cores (cores // writers threads)
  all           each writer every core, OpenMP's default spinning
  all_passive   each writer every core, idle OpenMP workers sleep at once (OMP_WAIT_POLICY=passive)
  share         the cores by need (`runtime/cores.py`): a writer stepping alone takes them
                all, writers stepping together split them, an idle one holds none
  lockstep      both models in one process on one thread pool, stepped one after the other
                (`runtime/baselines/lockstep.py`: the "fused in-process" candidate)

Each configuration runs whole waves of N requests for at least --min-s seconds per round.
Writes JSON (--out, default benchmarks/results/cores/NAME.json) with the host, every
round, and the median; prints a table. Outputs must agree across the routed configurations.
"""

from __future__ import annotations

import os

# the lockstep baseline steps in this process: the same passive OpenMP workers as `share` (set
# before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics
import sys
import time

from tokenrouter.bench import configs as C
from tokenrouter.bench import workload
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.baselines.lockstep import Lockstep
from tokenrouter.runtime.cores import host_cores
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.host import host_info, load_average
from tokenrouter.runtime.loader import model_facts, program_tokenizer
from tokenrouter.runtime.offline import LLM

CONFIGS = ("small_alone", "large_alone", "split", "all", "all_passive", "share", "share_spin", "lockstep")
ENV = {"all": {}, "all_passive": {"OMP_WAIT_POLICY": "passive"}, "share_spin": {"GOMP_SPINCOUNT": "30000"}}


def _with_env(env: dict[str, str], start):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return start()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


class Runtime:
    def __init__(self, name: str, program, opts: LaunchOptions, env: dict[str, str]):
        self.name = name
        self.llm = _with_env(env, lambda: LLM(program, launch=opts))

    def run(self, prompts, params, n):
        before = self.llm.stats()
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, concurrency=n, use_tqdm=False, ignore_eos=True,
                                 route_seeds=list(range(len(prompts))))
        wall = time.perf_counter() - t0
        after = self.llm.stats()
        steps = {w: after[w]["steps"] - before[w]["steps"] for w in after}
        fwd = {w: after[w]["phase_s"]["forward"] - before[w]["phase_s"]["forward"] for w in after}
        return wall, [list(o.token_ids) for o in outs], _written(o.tokens_by_model for o in outs), steps, fwd

    def close(self):
        self.llm.close()


class LockstepRuntime:
    name = "lockstep"

    def __init__(self, program, threads: int):
        self.ls, self.threads = Lockstep(program, threads=threads, num_blocks=512), threads

    def run(self, prompts_ids, params, n):
        t0 = time.perf_counter()
        outs = self.ls.generate(prompts_ids, params, concurrency=n, route_seeds=list(range(len(prompts_ids))))
        wall = time.perf_counter() - t0
        return wall, [list(o.token_ids) for o in outs], _written(o.tokens_by_model for o in outs), {}, {}

    def close(self):
        pass


def _written(items) -> dict[str, int]:
    tot: dict[str, int] = {}
    for d in items:
        for k, v in d.items():
            tot[k] = tot.get(k, 0) + v
    return tot


def start(name: str, program, small: str, large: str, cores: int):
    if name == "small_alone" or name == "large_alone":
        one = C.single_model(program, small if name == "small_alone" else large)
        return Runtime(name, one, LaunchOptions(threads={one.start: cores}), ENV["all_passive"])
    if name == "lockstep":
        return LockstepRuntime(program, cores)
    mode = "share" if name.startswith("share") else "split" if name == "split" else "all"
    return Runtime(name, program, LaunchOptions(cores=mode), ENV.get(name, {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("-n", "--concurrency", type=int, default=8)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", default=None,
                    help="a .jsonl of {\"prompt\": ...} asked through the chat template (default: the bench's workload)")
    ap.add_argument("--min-s", type=float, default=30.0, help="seconds per configuration per round (whole waves)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = [c for c in args.configs.split(",") if c]
    bad = [c for c in names if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    params_set = dict(kv.split("=", 1) for kv in args.set)
    program = load_program(args.file, params=params_set, model_facts=model_facts)
    small, large = C.small_and_large(program)
    tok = program_tokenizer(program)
    n, cores = args.concurrency, host_cores()
    if args.prompts:
        texts = workload.chat_prompts(args.prompts, tok, max(64, 8 * n))
    else:
        texts = workload.prompts(max(64, 8 * n))
    ids = [tok.encode(t) for t in texts]
    params = workload.sampling(args.max_tokens)
    deps = {}
    for name in names:
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        deps[name] = start(name, program, small, large, cores)
    host = host_info()
    rounds: dict[str, list[dict]] = {c: [] for c in names}
    outputs: dict[str, list] = {}
    print(f"measuring {', '.join(names)}: {args.rounds} round(s) of at least {args.min_s:g} s each",
          file=sys.stderr, flush=True)
    try:
        for d in deps.values():  # warm-up: one wave each
            d.run(ids[:n] if d.name == "lockstep" else texts[:n], params, n)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                d, t_all, toks, waves = deps[name], 0.0, 0, 0
                steps, fwd, written = {}, {}, {}
                while t_all < args.min_s:
                    batch = (ids if name == "lockstep" else texts)[(waves * n) % len(texts):][:n]
                    wall, outs, wb, st, fw = d.run(batch, params, n)
                    t_all += wall
                    toks += sum(len(o) for o in outs)
                    waves += 1
                    for k, v in wb.items():
                        written[k] = written.get(k, 0) + v
                    for k, v in st.items():
                        steps[k] = steps.get(k, 0) + v
                    for k, v in fw.items():
                        fwd[k] = fwd.get(k, 0) + v
                    if waves == 1 and r == 0:
                        outputs[name] = outs
                row = {"round": r, "tokens": toks, "wall_s": round(t_all, 2), "tokens_per_s": round(toks / t_all, 2),
                       "waves": waves, "written_by": written, "steps": steps,
                       "forward_ms_per_step": {w: round(1000 * fwd[w] / max(1, steps[w]), 2) for w in steps},
                       "load_average": load_average()}
                rounds[name].append(row)
                print(f"round {r} {name:12s} {row['tokens_per_s']:8.1f} tok/s  {written}  load {row['load_average']}",
                      file=sys.stderr, flush=True)
    finally:
        for d in deps.values():
            d.close()
    routed = [c for c in names if c not in ("small_alone", "large_alone") and c in outputs]
    agree = all(outputs[c] == outputs[routed[0]] for c in routed) if routed else None
    summary = {c: statistics.median(x["tokens_per_s"] for x in rounds[c]) for c in names}
    doc = {"program": args.file, "set": params_set, "prompts": args.prompts or "bench workload", "concurrency": n, "max_tokens": args.max_tokens,
           "min_s": args.min_s, "rounds": args.rounds, "cores": cores, "host": host,
           "command": " ".join([".venv/bin/python", "benchmarks/bench_cores.py", *(argv or sys.argv[1:])]),
           "outputs_agree": agree, "median_tokens_per_s": summary, "per_round": rounds}
    out = args.out or os.path.join("benchmarks", "results", "cores",
                                   os.path.splitext(os.path.basename(args.file))[0] + f"_n{n}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    ref = summary.get("small_alone")
    print(f"\n{'config':12s} {'tok/s':>8s} {'/ small':>8s}  rounds")
    for c in names:
        rel = f"{summary[c] / ref:.2f}x" if ref else "-"
        print(f"{c:12s} {summary[c]:8.1f} {rel:>8s}  " + " / ".join(f"{x['tokens_per_s']:.1f}" for x in rounds[c]))
    print(f"routed outputs agree: {agree}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
