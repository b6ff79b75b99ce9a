"""`tokenrouter profile FILE.route`: measure each model's step latency on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

from tokenrouter.commands._args import add_binding_args, bindings, positive_ints

HELP = "measure each model's step latency against batch size (alone and co-located) into a profile JSON"


def configure(parser) -> None:
    parser.add_argument("file", help="the .route program whose models to profile")
    parser.add_argument("--out", help="profile JSON to write (default: ./<file stem>.profile.json)")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="decode batch sizes (default 1,2,4,8,16,32)")
    parser.add_argument("--extend", default="4,16",
                        help="also time extends of these tokens per request (default 4,16; '' for none): "
                             "returning requests catch up by extends, and the tuner times their steps with them")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per point (median kept)")
    parser.add_argument("--no-colocate", action="store_true", help="skip the co-located measurements")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_binding_args(parser)


def run(args) -> int:
    from tokenrouter.compiler.pipeline import RouteError, load_program
    from tokenrouter.runtime.loader import LoadError, model_facts
    from tokenrouter.tuner.measure import measure_profile

    try:
        batch_sizes = positive_ints(args.batch_sizes, "--batch-sizes")
        extend = positive_ints(args.extend, "--extend") if args.extend else []
        if not batch_sizes:
            raise ValueError("--batch-sizes is empty")
        if args.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        params, model_paths = bindings(args)
        program = load_program(args.file, model_paths=model_paths, params=params, model_facts=model_facts)
    except RouteError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or f"{Path(args.file).stem}.profile.json"
    try:
        profile = measure_profile(program, batch_sizes, extend_tokens=extend, colocate=not args.no_colocate,
                                  repeats=args.repeats, progress=not args.no_progress, source=str(args.file))
    except Exception as exc:  # a model that fails to load or run: say which, no traceback
        if isinstance(exc, (LoadError, OSError, RuntimeError, ValueError)):
            print(f"error: profiling failed: {exc}", file=sys.stderr)
            return 2
        raise
    profile.save(out)
    for name, m in profile.models.items():
        pts = ", ".join(f"b={b}: {v:.2f}" for b, v in zip(m.alone.batch_sizes, m.alone.ms))
        print(f"{name}: {pts} ms" + (f"; co-located x{m.slowdown(1):.2f} at b=1" if m.co_located else ""))
    print(f"wrote {out}")
    return 0
