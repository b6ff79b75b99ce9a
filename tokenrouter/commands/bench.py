"""`tokenrouter bench FILE --concurrency 1,8,16,32`: every configuration side by side in one run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tokenrouter.commands._args import add_binding_args, bindings, positive_ints

HELP = "benchmark this runtime against its ablations and baselines, side by side, on the same prompts"

# --quick: concurrency 8, each configuration sized for >= 30 s a round (570 s and 600 s in the two
# committed runs on 2 cores, benchmarks/results/bench/quick*/details.json: elapsed_s)
QUICK = {"concurrency": "8", "requests": 16, "max_tokens": 128, "rounds": 2, "configs": "quick", "steady_s": 30.0}
# --long: the long-output workload (how each configuration's cost grows with context)
# (`official` runs one wave of N there: its large model recomputes every prefix, and two waves
# at 2,048 tokens take hours)
LONG = {"concurrency": "8", "requests": 8, "max_tokens": 2048, "rounds": 2, "configs": "quick", "steady_s": 0.0,
        "official_waves": 1}
# the full run: 64 requests x 256 tokens at 1, 8, 16, 32
FULL = {"concurrency": "1,8,16,32", "requests": 64, "max_tokens": 256, "rounds": 3, "configs": "all", "steady_s": 0.0}


def default_program() -> str:
    return str(Path(__file__).resolve().parents[2] / "examples" / "bench.route")


def configure(parser) -> None:
    parser.add_argument("file", nargs="?", default=None,
                        help="the .route program (default: examples/bench.route, the benchmark pair)")
    parser.add_argument("--concurrency", "-n", default=None,
                        help="comma-separated concurrency levels (default 1,8,16,32; --quick and --long: 8)")
    parser.add_argument("--quick", action="store_true",
                        help="concurrency 8, 128-token requests, each configuration sized for >= 30 s a round "
                             "(whole waves of 8, at most 64 requests), 2 rounds, the peers and tokenrouter")
    parser.add_argument("--long", action="store_true",
                        help="the long-output workload: 2048 new tokens per request at concurrency 8, 2 rounds "
                             "(official: one wave of 8)")
    parser.add_argument("--steady-s", type=float, default=None,
                        help="size each configuration's measurement for at least this many seconds at its own "
                             "speed, calibrated on the faster of two waves of requests up to 128 tokens long, in "
                             "whole waves of N (--quick: 30; otherwise 0: --requests for every configuration)")
    parser.add_argument("--out", default="bench-results/bench",
                        help="folder for summary.json, details.json and plots (default bench-results/bench, a "
                             "scratch folder git ignores)")
    parser.add_argument("--prompts", metavar="P.jsonl",
                        help="a .jsonl of {\"prompt\": ...}, each asked through the program's chat template (e.g. "
                             "data/prompts/code_heldout.jsonl for the coder pair; default: the bench's own prompts)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per measurement, at least 2 x concurrency (default 64)")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 256)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds; the median is reported (default 3)")
    parser.add_argument("--configs", default=None,
                        help="subset of tokenrouter,no_delay,no_pending,lockstep,naive,large_only,small_only,"
                             "llamacpp_std,llamacpp_large,official,tokenrouter_vllm,vllm_large,vllm_std,bound; "
                             "'all' (all but the vLLM ones), 'quick', or 'vllm' (tokenrouter on both engines and the "
                             "stock vLLM peers; the vllm extra, docs/engines.md) (default: all; --quick and --long: "
                             "quick)")
    parser.add_argument("--sweep", default="",
                        help="concurrency levels at which to also measure the large model's B over a grid")
    parser.add_argument("--profile", help="profile JSON from `tokenrouter profile` (default: measured here)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of lockstep, the single-model servers, llamacpp_large and official "
                             "(default 1; the routed servers, ours and llamacpp_std's, split the cores among "
                             "themselves)")
    parser.add_argument("--llama-server", metavar="PATH",
                        help="a llama-server binary built on this host (cmake -DGGML_NATIVE=ON) for the llama.cpp "
                             "peers, instead of the xllamacpp wheel's build (AVX2 on every x86 CPU)")
    add_binding_args(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quant", action="append", metavar="Q|NAME=Q",
                        help="override the models' weight format (all, or one model): none, native, int4, int8")


def _options(args):
    from tokenrouter.bench.configs import parse_configs
    from tokenrouter.bench.runner import BenchOptions
    from tokenrouter.prompts import read_prompts

    if args.quick and args.long:
        raise ValueError("--quick and --long are different workloads; choose one")
    q = QUICK if args.quick else LONG if args.long else FULL
    file = args.file or default_program()
    if not os.path.isfile(file):
        raise ValueError(f"no such file: {file}")
    levels = positive_ints(args.concurrency or q["concurrency"], "--concurrency")
    if not levels:
        raise ValueError("--concurrency is empty")
    sweep = positive_ints(args.sweep, "--sweep") if args.sweep else []
    if set(sweep) - set(levels):
        raise ValueError(f"--sweep levels {sorted(set(sweep) - set(levels))} are not among --concurrency")
    requests = args.requests if args.requests is not None else q["requests"]
    max_tokens = args.max_tokens if args.max_tokens is not None else q["max_tokens"]
    rounds = args.rounds if args.rounds is not None else q["rounds"]
    steady = args.steady_s if args.steady_s is not None else q["steady_s"]
    if steady < 0:
        raise ValueError("--steady-s must be >= 0")
    for v, what in ((requests, "--requests"), (max_tokens, "--max-tokens"), (rounds, "--rounds")):
        if v < 1:
            raise ValueError(f"{what} must be >= 1")
    params, models = bindings(args)
    if args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.prompts:  # read now, so that a bad file is one line before anything starts
        read_prompts(args.prompts)
    if args.profile and not os.path.isfile(args.profile):
        raise ValueError(f"no such profile: {args.profile}")
    if args.llama_server:
        from tokenrouter.bench.llamacpp import llama_server_problem
        why = llama_server_problem(args.llama_server)
        if why:
            raise ValueError(why)
    return BenchOptions(file=file, concurrency=levels, requests=requests, max_tokens=max_tokens, rounds=rounds,
                        configs=parse_configs(args.configs or q["configs"]), sweep=sweep, steady_s=steady, profile=args.profile,
                        progress=not args.no_progress, model_paths=models or None, params=params,
                        threads=args.threads, out_dir=args.out, quant=args.quant,
                        official_waves=q.get("official_waves"), llama_server=args.llama_server,
                        prompts=args.prompts)


def print_report(details: dict) -> None:
    from tokenrouter.bench.configs import CONFIGS
    host = details.get("host") or {}
    print(f"host: {host.get('cpu')}, {host.get('cores')} cores, read bandwidth {host.get('read_gb_per_s')} GB/s")
    for n, lv in details["levels"].items():
        print(f"\nN = {n}: {details['workload']['max_tokens']} tokens per request, B_i {lv['batch_thresholds']}, "
              f"identical routed outputs: {lv['identical_outputs']}, load average {lv.get('load_average')}")
        for c in CONFIGS:
            r = lv["configs"].get(c)
            if not r:
                continue
            if c == "bound":
                print(f"  {c:<14} {r['tokens_per_s']:8.1f} tok/s   (the profile's steps at their cheapest batch "
                      f"<= {n}, side by side, no waiting)")
                continue
            lat = r["latency_s"]
            lat_s = f"latency median {lat['median']:.2f} s, p99 {lat['p99']:.2f} s" if lat else "latency n/a"
            share = ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["share"].items())
            rounds = "/".join(f"{x:.1f}" for x in r["rounds_tokens_per_s"])
            print(f"  {c:<14} {r['tokens_per_s']:8.1f} tok/s (rounds {rounds}; {r['requests']} requests, "
                  f"{r['wall_s']:.0f} s)   {lat_s}   tokens: {share}")
        paired = lv.get("paired_ratios") or {}
        for k, v in lv["ratios"].items():
            each = "/".join(f"{x:.2f}" for x in (paired.get(k) or {}).get("rounds", []))
            print(f"  {k:<28} {v:5.2f}x" + (f"   (within each round: {each})" if each else ""))
        for k, v in (lv.get("of_bound") or {}).items():
            print(f"  {k:<14} {v:5.2f} of bound")
        for k, v in (lv.get("peer_agreement") or {}).items():
            print(f"  {k} agrees with ours: {100 * (v['identical_requests'] or 0):.0f}% of requests identical, "
                  f"{100 * (v['tokens_before_first_difference'] or 0):.0f}% of tokens before the first difference")
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
    from tokenrouter.bench.configs import NEED_BENCH_EXTRA
    from tokenrouter.bench.runner import run_bench
    from tokenrouter.compiler.pipeline import RouteError
    from tokenrouter.extras import MissingExtra, require_all
    peers = [c for c in opts.configs if c in NEED_BENCH_EXTRA]
    try:  # before anything runs: a missing extra is one line, not a traceback an hour in
        if peers:
            require_all("bench", f"the peer configuration(s) {', '.join(peers)}")
    except MissingExtra as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
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
    print_report(details)
    print(f"\nwrote {os.path.join(args.out, 'summary.json')}, details.json and {', '.join(os.path.basename(p) for p in pngs)}")
    ok = all(lv["identical_outputs"] is not False for lv in details["levels"].values())
    if not ok:
        print("error: routed configurations produced different tokens", file=sys.stderr)
    for n, why in details.get("failed_levels", {}).items():
        print(f"error: level N={n} failed and has no figures: {why}", file=sys.stderr)
    return 0 if ok and not details.get("failed_levels") else 1
