"""The engine's linear layer on this CPU: MKL sgemm layouts against a oneDNN-packed weight.

Decode and extend steps multiply a few rows by each weight matrix. This measures, side by
side in one run, `F.linear(x, W)`, `(W @ x.T).T` and oneDNN's matmul on a weight reordered
once (`torch.ops.mkldnn._reorder_linear_weight`), for the shapes of SmolLM2-135M and
bench-large, at 1..256 rows, 1 thread. It is what `tokenrouter/runtime/engine/layers.py`
chooses by (oneDNN from two rows up).

    python benchmarks/bench_linear.py        # ~1 min; writes benchmarks/results/bench_linear.{json,png}
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.nn.functional as F

SHAPES = {"smollm2 gate_up": (3072, 576), "smollm2 lm_head": (49152, 576),
          "bench-large gate_up": (6144, 1024), "bench-large down": (1024, 3072)}
ROWS = (1, 2, 4, 8, 16, 64, 256)
OUT = os.path.join(os.path.dirname(__file__), "results", "bench_linear")


def median_ms(fn, n: int = 15) -> float:
    for _ in range(2):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


def main() -> None:
    torch.set_num_threads(1)
    results = []
    for name, (out_f, in_f) in SHAPES.items():
        w = torch.randn(out_f, in_f)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        for rows in ROWS:
            x = torch.randn(rows, in_f)
            r = {"shape": name, "rows": rows,
                 "F.linear": median_ms(lambda: F.linear(x, w)),
                 "W@x.T": median_ms(lambda: (w @ x.T).T),
                 "onednn": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))}
            r["best plain / onednn"] = min(r["F.linear"], r["W@x.T"]) / r["onednn"]
            results.append(r)
            print(f"{name:22s} rows {rows:4d}: F.linear {r['F.linear']:7.2f} ms  W@x.T {r['W@x.T']:7.2f} ms  "
                  f"oneDNN {r['onednn']:7.2f} ms  (x{r['best plain / onednn']:.2f})")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT + ".json", "w") as f:
        json.dump({"threads": 1, "torch": torch.__version__, "results": results}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(4 * len(SHAPES), 3.2))
    for ax, name in zip(axes, SHAPES):
        rs = [r for r in results if r["shape"] == name]
        for key in ("F.linear", "W@x.T", "onednn"):
            ax.plot([r["rows"] for r in rs], [r[key] for r in rs], marker="o", label=key)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("rows")
    axes[0].set_ylabel("ms")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT + ".png", dpi=110)
    print(f"wrote {OUT}.json and .png")


if __name__ == "__main__":
    main()
