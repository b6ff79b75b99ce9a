"""`tokenrouter bench runlength-check [FILE]`: run lengths of a real routed run, fitted, and
the tuner's predictions against the runtime's measured throughput (`bench/runlength_check.py`)."""

from __future__ import annotations

import os

from tokenrouter.commands.bench import default_program

HELP = "run lengths of a real routed run, and the tuner's predictions against measured throughput"


def configure(parser) -> None:
    parser.add_argument("file", nargs="?", default=os.path.join(os.path.dirname(default_program()), "demo.route"),
                        help="the .route program (default: examples/demo.route, R-Stitch on the demo pair)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=None, help="B of the large model (default: the launcher's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--out", default="bench-results/runlengths")


def run(args) -> int:
    from tokenrouter.bench.runlength_check import CheckOptions, runlength_check

    doc = runlength_check(CheckOptions(file=args.file, concurrency=args.concurrency, requests=args.requests,
                                       max_tokens=args.max_tokens, batch=args.batch, rounds=args.rounds,
                                       profile=args.profile, out=args.out))
    measured, batch = doc["measured"], doc["batch"]
    x = measured["tokens_per_s"]
    print(f"\n{args.file}, N = {args.concurrency}, B = {batch}; measured {x:.1f} tok/s "
          f"(rounds {', '.join(f'{r:.1f}' for r in measured['rounds_tokens_per_s'])}), share {measured['share']}")
    for m, d in doc["runlengths"].items():
        print(f"  {m}: {d['count']} runs, mean {d['mean']:.2f}, max {d['max']}, fitted {d['fitted']}")
    for k, p in doc["predictions"].items():
        print(f"  {k:<20} {p['tokens_per_s']:8.1f} tok/s ({p['method']}): {100 * p['error_vs_measured']:+.1f}% vs measured")
    return 0
