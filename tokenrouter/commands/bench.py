"""`tokenrouter bench FILE --concurrency 1,8,16,32`: every configuration side by side in one run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tokenrouter.commands._args import add_binding_args, bindings, positive_ints

HELP = "benchmark this runtime against its ablations and baselines, side by side, on the same prompts"

QUICK = {"concurrency": "1,8", "requests": 4, "max_tokens": 24, "rounds": 2}


def default_program() -> str:
    return str(Path(__file__).resolve().parents[2] / "examples" / "bench.route")


def configure(parser) -> None:
    parser.add_argument("file", nargs="?", default=None,
                        help="the .route program (default: examples/bench.route, the benchmark pair)")
    parser.add_argument("--concurrency", "-n", default=None,
                        help="comma-separated concurrency levels (default 1,8,16,32; --quick: 1,8)")
    parser.add_argument("--quick", action="store_true",
                        help="concurrency 1 and 8, fewer and shorter requests, 2 rounds (routine checks)")
    parser.add_argument("--out", default="bench-out", help="folder for summary.json, details.json and plots")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per measurement, at least 2 x concurrency (default 16)")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds; the median is reported (default 3)")
    parser.add_argument("--configs", default="all",
                        help="subset: tokenrouter,no_delay,no_pending,lockstep,naive,large_only,small_only")
    parser.add_argument("--sweep", default="",
                        help="concurrency levels at which to also measure the large model's B over a grid")
    parser.add_argument("--profile", help="profile JSON from `tokenrouter profile` (default: measured here)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of lockstep and of the single-model servers (default 1; the "
                             "routed servers split the cores among themselves)")
    add_binding_args(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quant", action="append", metavar="Q|NAME=Q",
                        help="override the models' weight format (all, or one model): none, native, int4, int8")


def _options(args):
    from tokenrouter.bench.configs import parse_configs
    from tokenrouter.bench.runner import BenchOptions

    q = QUICK if args.quick else {}
    file = args.file or default_program()
    if not os.path.isfile(file):
        raise ValueError(f"no such file: {file}")
    levels = positive_ints(args.concurrency or q.get("concurrency", "1,8,16,32"), "--concurrency")
    if not levels:
        raise ValueError("--concurrency is empty")
    sweep = positive_ints(args.sweep, "--sweep") if args.sweep else []
    if set(sweep) - set(levels):
        raise ValueError(f"--sweep levels {sorted(set(sweep) - set(levels))} are not among --concurrency")
    requests = args.requests if args.requests is not None else q.get("requests", 16)
    max_tokens = args.max_tokens if args.max_tokens is not None else q.get("max_tokens", 64)
    rounds = args.rounds if args.rounds is not None else q.get("rounds", 3)
    for v, what in ((requests, "--requests"), (max_tokens, "--max-tokens"), (rounds, "--rounds")):
        if v < 1:
            raise ValueError(f"{what} must be >= 1")
    params, models = bindings(args)
    if args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.profile and not os.path.isfile(args.profile):
        raise ValueError(f"no such profile: {args.profile}")
    return BenchOptions(file=file, concurrency=levels, requests=requests, max_tokens=max_tokens, rounds=rounds,
                        configs=parse_configs(args.configs), sweep=sweep, profile=args.profile,
                        progress=not args.no_progress, model_paths=models, params=params,
                        threads=args.threads, out_dir=args.out, quant=args.quant)


def print_report(details: dict, summary: dict) -> None:
    from tokenrouter.bench.configs import CONFIGS
    for n, lv in details["levels"].items():
        print(f"\nN = {n}: {lv['requests']} requests x {details['workload']['max_tokens']} tokens, "
              f"B_i {lv['batch_thresholds']}, identical routed outputs: {lv['identical_outputs']}")
        for c in CONFIGS:
            r = lv["configs"].get(c)
            if not r:
                continue
            lat = r["latency_s"]
            lat_s = f"latency median {lat['median']:.2f} s, p99 {lat['p99']:.2f} s" if lat else "latency n/a"
            share = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["share"].items())
            print(f"  {c:<12} {r['tokens_per_s']:8.1f} tok/s   {lat_s}   tokens: {share}")
        for k, v in lv["ratios"].items():
            print(f"  {k:<24} {v:5.2f}x")
        for c, p in (lv.get("predicted") or {}).items():
            if p and "tokens_per_s" in p and c in lv["configs"]:
                meas = lv["configs"][c]["tokens_per_s"]
                print(f"  predicted {c:<12} {p['tokens_per_s']:8.1f} tok/s ({p['method']}); "
                      f"measured / predicted {meas / p['tokens_per_s']:.2f}")
        sw = lv.get("sweep")
        if sw:
            pts = ", ".join(f"B={p['B']}: {p['tokens_per_s']:.1f}" for p in sw["points"])
            print(f"  sweep of B({sw['model']}): {pts}; best B = {sw['best_measured_B']}, tuned B = "
                  f"{sw['tuned_B']} ({100 * sw['tuned_over_best']:.1f}% of the best)")


def run(args) -> int:
    try:
        opts = _options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tokenrouter.bench import plots, results
    from tokenrouter.bench.runner import run_bench
    from tokenrouter.compiler.frontend import RouteError
    from tokenrouter.runtime.frontend import RuntimeUnavailable
    from tokenrouter.runtime.loader import LoadError

    try:
        details, summary = run_bench(opts)
    except RouteError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except (ValueError, LoadError, RuntimeUnavailable, RuntimeError, OSError, TimeoutError) as exc:
        print(f"error: bench failed: {exc}", file=sys.stderr)
        return 2
    details["command"] = "tokenrouter bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "tokenrouter bench"
    os.makedirs(args.out, exist_ok=True)
    results.write_json(os.path.join(args.out, "summary.json"), summary)
    results.write_json(os.path.join(args.out, "details.json"), details)
    pngs = plots.plot_all(details, args.out)
    print_report(details, summary)
    print(f"\nwrote {os.path.join(args.out, 'summary.json')}, details.json and {', '.join(os.path.basename(p) for p in pngs)}")
    ok = all(lv["identical_outputs"] is not False for lv in details["levels"].values())
    if not ok:
        print("error: routed configurations produced different tokens", file=sys.stderr)
    return 0 if ok else 1
