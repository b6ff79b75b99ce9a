"""Shapes for the random-weight benchmark pair: the paper's Qwen3-0.6B / Qwen3-32B pair steps in
6.0 ms and 27.9 ms (4.6x). We keep the small model fixed (`bench_pair.SHAPES["small"]`) and
measure candidate large shapes in our engine, interleaved in rounds so noise hits all alike, at
batch 1 and 8 with ~64 tokens of context; the ratio closest to 4.6 at batch 1 is the one
`bench_pair.SHAPES["large"]` should hold.

    python benchmarks/bench_pair_shapes.py          # ~2-4 minutes on 2 cores
Writes bench_pair_shapes.json and .png at --out (default bench-results/bench_pair_shapes, a scratch
folder git ignores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.loader.builtin.bench_pair import SHAPES, bench_config, random_weights
from tokenrouter.runtime.loader.hf import parse_config

PAPER_RATIO = 27.9 / 6.0

CANDIDATES = {
    "small (bench-small)": SHAPES["small"],
    "large (bench-large)": SHAPES["large"],
    "1024 x 12 layers": {**SHAPES["large"], "num_hidden_layers": 12},
    "1024 x 16 layers": {**SHAPES["large"], "num_hidden_layers": 16},
    "1024 x 20 layers": {**SHAPES["large"], "num_hidden_layers": 20},
    "768 x 24 layers": {"hidden_size": 768, "intermediate_size": 2304, "num_hidden_layers": 24,
                        "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64},
}


def measure(shapes: dict[str, dict], batch: int, rounds: int, steps: int, ctx: int) -> dict[str, float]:
    engines = {}
    for name, shape in shapes.items():
        raw = {**bench_config("small"), **shape}
        eng = Engine(parse_config(raw, name), random_weights(raw, seed=1),
                     EngineOptions(max_model_len=ctx + rounds * (steps + 1) + 16,
                                   num_blocks=batch * ((ctx + rounds * (steps + 1) + 16) // 16 + 1)))
        eng.step([(i, list(range(100, 100 + ctx))) for i in range(batch)])
        engines[name] = eng
    samples: dict[str, list[float]] = {n: [] for n in shapes}
    tok = [(i, [7]) for i in range(batch)]
    for _ in range(rounds):
        for name, eng in engines.items():
            eng.step(tok)
            t = time.perf_counter()
            for _ in range(steps):
                eng.step(tok)
            samples[name].append((time.perf_counter() - t) / steps * 1e3)
    return {n: statistics.median(s) for n, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench-results/bench_pair_shapes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"paper_ratio": PAPER_RATIO, "threads": args.threads, "shapes": CANDIDATES, "batches": {}}
    for batch in (1, 8):
        ms = measure(CANDIDATES, batch, args.rounds, steps=6, ctx=64)
        small = ms["small (bench-small)"]
        result["batches"][batch] = {n: {"step_ms": v, "ratio_to_small": v / small} for n, v in ms.items()}
        print(f"batch {batch}: " + ", ".join(f"{n} {v:.1f} ms ({v / small:.2f}x)" for n, v in ms.items()))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    names = [n for n in CANDIDATES if not n.startswith("small")]
    for i, batch in enumerate((1, 8)):
        ax.bar([j + 0.4 * i for j in range(len(names))],
               [result["batches"][batch][n]["ratio_to_small"] for n in names], width=0.4, label=f"batch {batch}")
    ax.axhline(PAPER_RATIO, color="C3", ls="--", label="paper 27.9/6.0 ms = 4.6x")
    ax.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=15, fontsize=8)
    ax.set_ylabel("step time / bench-small step time")
    ax.set_title("Benchmark pair: large candidates against bench-small (our engine, CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(f"wrote {args.out}.json and .png")


if __name__ == "__main__":
    main()
