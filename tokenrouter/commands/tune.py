"""`tokenrouter tune FILE.route --concurrency N`: pick delayed-batching thresholds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenrouter.commands._args import add_binding_args, bindings

HELP = "predict throughput over batch thresholds (Markov chain) and pick the best B"


def configure(parser) -> None:
    parser.add_argument("file", help="the .route program")
    parser.add_argument("--concurrency", "-n", type=int, required=True, help="concurrent requests N")
    parser.add_argument("--profile", help="profile JSON from `tokenrouter profile` "
                        "(default: ./<file stem>.profile.json)")
    parser.add_argument("--route-prob", help="p_small_to_large,p_large_to_small: per-token handoff "
                        "probabilities (default: what the program fixes, or the run lengths)")
    parser.add_argument("--runlengths", help="JSON of observed run lengths per model; fitted as "
                        "phase-type distributions instead of geometric")
    parser.add_argument("--out", default="tune-out", help="folder for tune.json and tune.png")
    parser.add_argument("--batch-sizes", help="candidate thresholds, e.g. 1,2,4,8 (default: 1..N)")
    parser.add_argument("--method", choices=("auto", "chain", "simulation"), default="auto",
                        help="the Markov chain, the simulator, or the chain while it fits (default)")
    parser.add_argument("--independent", action="store_true",
                        help="models on independent hardware: no co-location slowdown")
    add_binding_args(parser)


def _floats(text: str, what: str, n: int | None = None) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if n is not None and len(vals) != n:
        raise ValueError(f"{what} needs {n} numbers, got {len(vals)}")
    return vals


def run(args) -> int:
    from tokenrouter.compiler.pipeline import check_file
    from tokenrouter.runtime.loader import model_facts
    from tokenrouter.dsl.diagnostics import render_all
    from tokenrouter.tuner import api, dtmc
    from tokenrouter.tuner.plots import plot_curve
    from tokenrouter.tuner.profile import Profile
    from tokenrouter.tuner.program import inputs_from_program
    from tokenrouter.tuner.runlength import load_traces

    try:
        params, model_paths = bindings(args)
        program, diags = check_file(args.file, model_paths=model_paths, params=params, model_facts=model_facts)
        if program is None:
            try:
                source = Path(args.file).read_text(encoding="utf-8", errors="replace")
            except OSError:
                source = None
            print(render_all(diags, source), file=sys.stderr)
            return 1
        inp = inputs_from_program(program)
        if args.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        profile_path = args.profile or f"{Path(args.file).stem}.profile.json"
        if not args.profile and not Path(profile_path).exists():
            raise ValueError(f"no profile given and no {profile_path} here; run "
                             f"`tokenrouter profile {args.file} --out {profile_path}` or pass --profile")
        profile = Profile.load(profile_path)
        probs = {k: dict(v) for k, v in inp.route_probs.items()}
        if args.route_prob:
            if len(inp.models) != 2:
                raise ValueError("--route-prob takes two probabilities and needs a two-model program")
            a, b = _floats(args.route_prob, "--route-prob", 2)
            probs = api.route_table(inp.models, (a, b))
        observed = load_traces(args.runlengths) if args.runlengths else None
        unknown = [m for m in inp.models if m not in probs and m not in (observed or {})]
        if unknown:
            raise ValueError(f"no routing probability for {', '.join(unknown)}: the program does not fix it; "
                             "pass --route-prob or --runlengths")
        candidates = [int(b) for b in _floats(args.batch_sizes, "--batch-sizes")] if args.batch_sizes else None
        tuned = [m for m in inp.auto] or [None]
        system = api.build_system(profile, args.concurrency, probs, observed, models=inp.models,
                                  start=inp.start, rewrite=inp.rewrite, batch=inp.batch,
                                  max_wait_ms=inp.max_wait_ms, colocated=not args.independent)
        if len(tuned) > 1:
            raise ValueError(f"`auto` on several models ({', '.join(tuned)}): the tuner searches one "
                             "threshold; fix the others in the serve section")
        print(f"tuning {tuned[0] or api.slowest(system)} at N = {args.concurrency} "
              f"(profile {profile_path}, {'co-located' if system.colocated else 'independent'} models)")
        for m in system.models:
            rl = system.runlength[m]
            print(f"  run length on {m}: mean {rl.mean():.2f} steps, {rl.phases} phase(s)")

        def show(b, p):
            extra = f" +-{p.detail['ci95']:.1f}" if "ci95" in p.detail else ""
            print(f"  B = {b:3d}  {p.throughput:9.1f} tok/s{extra}  {p.latency_ms_per_token:8.2f} ms/token  ({p.method})",
                  flush=True)

        result = api.tune(system, model=tuned[0], candidates=candidates, method=args.method, progress=show)
    except (ValueError, OSError, dtmc.ChainTooLarge) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    b = result.best
    print(f"B* = {b.batch[result.searched]} for {result.searched}: {b.throughput:.1f} tokens/s "
          f"({b.throughput / result.upper_bound:.0%} of the upper bound {result.upper_bound:.1f})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"program": str(args.file), "profile": str(profile_path), "batch": b.batch, **result.to_dict()}
    (out / "tune.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_curve(result, out / "tune.png", title=f"{Path(args.file).name}, N = {args.concurrency}")
    print(f"wrote {out / 'tune.json'} and {out / 'tune.png'}")
    return 0
