"""Do a routing program's greedy tokens depend on the deployment? Real weights, real subservers.

Runs the shipped eval tasks (chat template, greedy, stop tokens honoured) through the offline
API four ways and compares every request's tokens with the first:

- concurrency 1 (one request in flight: the single-request schedule);
- concurrency N (requests share every step, in changing batches);
- concurrency N with re-matching (`retention = rematch`: a returning request re-prefix-matched as new);
- concurrency N with re-matching and relayed handoffs (the naive baseline's deployment).

Exactness is the runtime's invariant (docs/architecture.md, invariant 5); with bfloat16
activations (a `quant = native` model) it holds only if every kernel is batch-invariant
(docs/models.md, "One kernel per shape").

    python benchmarks/batch_invariance.py examples/demo.route --tasks 40 --out bench-results/invariance
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from tokenrouter.runtime.host import host_info
from tokenrouter.eval.run import encode_prompts
from tokenrouter.eval.tasks import SHIPPED_TASKS, load_tasks
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.offline import LLM

DEPLOYMENTS = {"concurrency 1": ({}, 1), "concurrency N": ({}, None),
               "re-matched": ({"retention": "rematch"}, None),
               "re-matched, relayed": ({"retention": "rematch", "transport": "relay"}, None)}


def run(route: str, tasks, max_tokens: int, concurrency: int, launch: dict) -> tuple[list[list[int]], float]:
    with LLM(route, **launch) as llm:
        ids = encode_prompts(llm.tokenizer, [t.prompt for t in tasks])
        t0 = time.perf_counter()
        outs = llm.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0),
                            concurrency=concurrency, desc=f"c={concurrency} {launch or ''}")
        return [o.token_ids for o in outs], time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("route")
    ap.add_argument("--tasks", type=int, default=40, help="the first N shipped eval tasks (default 40)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", default="bench-results/invariance")
    args = ap.parse_args(argv)
    tasks = load_tasks(SHIPPED_TASKS)[:args.tasks]
    first, results = None, {}
    for name, (launch, c) in DEPLOYMENTS.items():
        outs, wall = run(args.route, tasks, args.max_tokens, c or args.concurrency, launch)
        first = first or outs
        differ = [i for i, (a, b) in enumerate(zip(first, outs)) if a != b]
        results[name] = {"differing_prompts": differ, "tokens": sum(map(len, outs)), "wall_s": round(wall, 1)}
        print(f"{name:>22}: {len(differ)}/{len(tasks)} prompts differ from concurrency 1 {differ or ''}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "batch_invariance.json")
    with open(path, "w") as f:
        json.dump({"route": args.route, "tasks": len(tasks), "max_tokens": args.max_tokens,
                   "concurrency": args.concurrency, "host": host_info(), "deployments": results}, f, indent=1)
    print(f"wrote {path}")
    return 0 if all(not r["differing_prompts"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
