"""Parse + check time of generated .route files with 100 to 1,000 rules (target: 1,000
rules in under one second). Run: python benchmarks/bench_parse.py [--repeat N] [--out DIR]

The generated program has 50 models; each rule hands off from one model to another on a
different feature and threshold (none shadowed, no ping-pong), so every pass does its
full work. Prints the times, writes bench-results/parse.json and parse.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenrouter.compiler.pipeline import check_source  # noqa: E402
from tokenrouter.dsl.parser import lark_parser, parse_source  # noqa: E402
from tokenrouter.runtime.loader import model_facts

FEATURES = ["entropy(m{i}, normalized) > {t}", "top_prob(m{i}) < {t}", "margin(m{i}) <= {t}",
            "entropy(m{i}, raw) >= {t}"]


def generate(rules: int, models: int = 50) -> str:
    lines = ["tokenrouter 1", ""]
    lines += [f'model m{i} = "{"smollm2-135m" if i else "smollm2-135m-small"}"' for i in range(models)]
    lines += ["", "route {", "  start m0"]
    per_source: dict[int, int] = {}
    for r in range(rules):
        src = r % models
        k = per_source.get(src, 0)
        per_source[src] = k + 1
        dst = (src + 1 + k) % models or 1
        if dst == src:
            dst = (dst + 1) % models
        feature = FEATURES[k % len(FEATURES)]
        threshold = round(0.99 - 0.01 * (k // len(FEATURES)), 2)  # a feature's later rules are never covered
        if "<" in feature:
            threshold = round(0.01 + 0.01 * (k // len(FEATURES)), 2)
        lines.append(f"  m{src} -> m{dst} when {feature.format(i=src, t=threshold)} and visit_tokens >= 1 keep")
    lines += ["}", "", "serve {", "  batch = auto", "  max_wait = 20ms", "}", ""]
    return "\n".join(lines)


def timed(fn, repeat: int) -> float:
    """Median wall time; `cpu` collects the process CPU time too (robust to a busy machine)."""
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    timed.cpu = statistics.median(cpu)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lark_parser()
    build = time.perf_counter() - t0
    rows = []
    for rules in (100, 250, 500, 1000):
        text = generate(rules)
        program, diags = check_source(text, "generated.route", base_dir=".", model_facts=model_facts)
        assert program is not None and not diags, [str(d) for d in diags[:3]]
        assert len(program.transitions) == rules
        parse_s = timed(lambda: parse_source(text, "generated.route"), args.repeat)
        total_s = timed(lambda: check_source(text, "generated.route", base_dir=".", model_facts=model_facts), args.repeat)
        rows.append({"rules": rules, "bytes": len(text), "parse_s": parse_s, "parse_and_check_s": total_s,
                     "parse_and_check_cpu_s": timed.cpu})
        print(f"{rules:5d} rules  {len(text) / 1024:6.1f} KiB  parse {parse_s * 1000:7.1f} ms  "
              f"parse+check {total_s * 1000:7.1f} ms (cpu {timed.cpu * 1000:7.1f} ms)")
    last = rows[-1]
    verdict = "PASS" if last["parse_and_check_s"] < 1.0 else "FAIL"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"grammar build (once per process): {build * 1000:.0f} ms; load average {load:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"1,000 rules: {last['parse_and_check_s']:.3f} s parse+check (target < 1 s): {verdict}; "
          f"check is {last['parse_and_check_s'] / last['parse_s']:.2f}x the parse alone")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "parse.json"), "w") as f:
        json.dump({"grammar_build_s": build, "load_average": load, "cpus": os.cpu_count(), "rows": rows, "target_s": 1.0, "verdict": verdict}, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = [r["rules"] for r in rows]
    ax.plot(xs, [r["parse_s"] * 1000 for r in rows], "o-", label="parse")
    ax.plot(xs, [r["parse_and_check_s"] * 1000 for r in rows], "s-", label="parse + check + lower")
    ax.axhline(1000, color="grey", ls="--", lw=1, label="target (1 s at 1,000 rules)")
    ax.set_xlabel("rules in the file")
    ax.set_ylabel("ms (median)")
    ax.set_title(".route front end")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "parse.png"), dpi=120)
    print(f"wrote {args.out}/parse.json and parse.png")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
