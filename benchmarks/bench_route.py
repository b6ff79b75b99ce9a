"""Route overhead per step: the generated batched `route` against the reference interpreter
(one request at a time) and against the small model's decode step in our engine.

For the R-Stitch and R2R examples, at batch 1, 8 and 64 on CPU, in interleaved rounds (so
machine noise hits every variant alike), medians of:
- `route`: the generated router's `route(step)` (logits [B, V], and for R2R the final
  hidden state, the sampled token's embedding and the top-100 logits through the router
  MLP with random weights of the declared shapes: no trained weights ship);
- `interpreter`: the reference interpreter deciding the same B requests one by one;
- `forward`: one decode step of the small model (smollm2-135m-small when its weights are
  installed, else the random-weight bench-small) on B sequences of 64-token contexts,
  including the features the router needs (hidden state, token embedding).
Ratios are printed and written with the raw figures to bench_route.json and .png in --out
(default bench-results/, a scratch folder git ignores).

    python benchmarks/bench_route.py             # ~2-4 minutes on 2 cores
    python benchmarks/bench_route.py --quick     # fewer rounds
    python benchmarks/bench_route.py --threads 2 # torch intra-op threads (default 1)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tokenrouter.compiler import ir  # noqa: E402
from tokenrouter.protocol.step import StepTensors  # noqa: E402
from tokenrouter.compiler.backend.compiled import load_routers  # noqa: E402
from tokenrouter.compiler.pipeline import check_file  # noqa: E402
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep  # noqa: E402
from tokenrouter.runtime.loader import model_facts

BATCHES = (1, 8, 64)
CONTEXT = 64


def load_small():
    from tokenrouter.runtime.loader import load_model
    for name in ("smollm2-135m-small", "bench-small"):
        try:
            return load_model(name)
        except Exception as exc:  # weights not installed: fall back to the random pair
            print(f"cannot load {name}: {exc}", file=sys.stderr)
    raise SystemExit("no small model available")


def example(name: str, folder: str, weights_dir: str) -> ir.Program:
    """The example, its models pointed at the small model's folder (input widths from its
    config), router weights moved to `weights_dir` with random values of the right shapes."""
    path = os.path.join(REPO, "examples", f"{name}.route")
    program, diags = check_file(path, model_facts=model_facts)
    program, diags = check_file(path, model_paths={m.name: folder for m in program.models}, model_facts=model_facts)
    if program is None:
        raise SystemExit("\n".join(map(str, diags)))
    from safetensors.torch import save_file

    from tokenrouter.compiler.weights.nets import input_width
    routers = []
    for r in program.routers:
        f = os.path.join(weights_dir, os.path.basename(r.file))
        g = torch.Generator().manual_seed(0)
        w = input_width(r)
        save_file({"layers.0.weight": torch.randn(256, w, generator=g) / w ** 0.5,
                   "layers.0.bias": torch.zeros(256), "layers.1.weight": torch.randn(1, 256, generator=g) / 16,
                   "layers.1.bias": torch.zeros(1)}, f)
        routers.append(dataclasses.replace(r, file=f))
    return dataclasses.replace(program, routers=tuple(routers))


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else 7

    from tokenrouter.runtime.engine.engine import Engine
    from tokenrouter.runtime.engine.options import EngineOptions
    small = load_small()
    cfg = small.config
    tmp = tempfile.mkdtemp()
    programs = {n: example(n, small.folder, tmp) for n in ("rstitch", "r2r")}
    routers = {n: load_routers(p)["slm"] for n, p in programs.items()}
    interps = {n: Interpreter(p) for n, p in programs.items()}
    needs_all = routers["r2r"].needs

    eng = Engine(cfg, small.weights,
                 EngineOptions(num_blocks=max(BATCHES) * (CONTEXT // 16 + 4), max_model_len=CONTEXT + 64))
    rng = np.random.default_rng(0)
    inputs = {}
    for b in BATCHES:
        seqs = [(("s", b, i), rng.integers(0, cfg.vocab_size, CONTEXT).tolist()) for i in range(b)]
        out = eng.step(seqs, needs_all)  # prefill
        sampled = out.logits.argmax(-1)
        step = StepTensors(logits=out.logits, sampled=sampled, visit_tokens=torch.ones(b, dtype=torch.int64),
                           position=torch.arange(b), request_seed=torch.arange(b), hidden=out.hidden,
                           token_embedding=eng.embed(sampled))
        rows = [RequestStep(logits=out.logits[i].double().numpy(), sampled=int(sampled[i]), visit_tokens=1,
                            position=i, request_seed=i, hidden={k: v[i].double().numpy() for k, v in out.hidden.items()},
                            token_embedding=step.token_embedding[i].double().numpy()) for i in range(b)]
        inputs[b] = (seqs, step, rows)

    def forward(b):
        seqs, _, _ = inputs[b]
        for sid, _ in seqs:  # keep the context at CONTEXT + 1 tokens: decode one, then drop it
            eng.free(sid)
        eng.step(seqs, needs_all)  # (re)prefill outside the timed decode
        t = time.perf_counter()
        out = eng.step([(sid, [1]) for sid, _ in seqs], needs_all)
        eng.embed(out.logits.argmax(-1))
        return time.perf_counter() - t

    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for b in BATCHES:
            _, step, rows = inputs[b]
            samples.setdefault(f"forward/{b}", []).append(forward(b))
            for n in programs:
                r, it = routers[n], interps[n]
                samples.setdefault(f"{n}/route/{b}", []).append(timed(lambda: r.route(step), 20))
                samples.setdefault(f"{n}/interpreter/{b}", []).append(
                    timed(lambda: [it.route("slm", row) for row in rows], 2 if b > 8 else 5))

    med = {k: statistics.median(v) for k, v in samples.items()}
    results = {"model": small.name, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "context": CONTEXT,
               "threads": args.threads, "rounds": rounds, "median_s": med, "rows": []}
    print(f"small model {small.name} (V={cfg.vocab_size}, H={cfg.hidden_size}), torch threads {args.threads}, "
          f"{rounds} interleaved rounds, medians")
    print(f"{'program':8} {'B':>3} {'route ms':>9} {'interp ms':>10} {'interp/route':>12} "
          f"{'forward ms':>10} {'route/forward':>13}")
    for n in programs:
        for b in BATCHES:
            r, i, f = med[f"{n}/route/{b}"], med[f"{n}/interpreter/{b}"], med[f"forward/{b}"]
            row = {"program": n, "batch": b, "route_ms": r * 1e3, "interpreter_ms": i * 1e3,
                   "forward_ms": f * 1e3, "interpreter_over_route": i / r, "route_over_forward": r / f}
            results["rows"].append(row)
            print(f"{n:8} {b:>3} {r * 1e3:9.3f} {i * 1e3:10.3f} {i / r:12.1f} {f * 1e3:10.2f} {r / f:13.3%}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_route.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    plot(results, os.path.join(args.out, "bench_route.png"))
    return 0


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for n, marker in (("rstitch", "o"), ("r2r", "s")):
        rows = [r for r in results["rows"] if r["program"] == n]
        bs = [r["batch"] for r in rows]
        axes[0].plot(bs, [r["route_ms"] for r in rows], marker=marker, label=f"{n} route (generated)")
        axes[0].plot(bs, [r["interpreter_ms"] for r in rows], marker=marker, ls="--", label=f"{n} interpreter")
        axes[1].plot(bs, [100 * r["route_over_forward"] for r in rows], marker=marker, label=n)
    rows = [r for r in results["rows"] if r["program"] == "rstitch"]
    axes[0].plot([r["batch"] for r in rows], [r["forward_ms"] for r in rows], "k:", label="small model forward")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms per step")
    axes[1].set_ylabel("route time, % of the small model's step")
    fig.suptitle(f"route overhead ({results['model']}, {results['threads']} thread(s))")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
