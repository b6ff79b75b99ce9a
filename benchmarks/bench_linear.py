"""The engine's linear layer on this CPU: MKL sgemm layouts against oneDNN-packed weights.

Decode and extend steps multiply a few rows by every weight matrix of the model. The
engine does not take its choice from here: `tokenrouter/runtime/kernels/plan.py` times
the same candidates on the host at a model's first load. This script shows why that has
to be measured per host. Its **cold** section is what the engine's measurement mirrors: one pass over
a whole model's weight set (SmolLM2-135M's shapes: 30 layers x qkv/o/gate_up/down plus
the 49152-row LM head, 538 MB in float32), so every weight streams from memory as it does
in a real step. Methods, side by side in one run, at 2 threads (the comparison with
`transformers`) and 1 thread (a served subserver):

- `F.linear(x, W)`;
- `W @ x.T` (one row is padded to two real rows; MKL's one-row path is slower);
- oneDNN's matmul on a weight reordered once, with no row hint and with the 16-row hint
  the engine uses (`torch.ops.mkldnn._reorder_linear_weight(W, 16)`).

The **hot** section repeats one matrix (cache-resident) at 1 thread, for reference only:
it favours oneDNN at one or two rows, which the cold pass does not.

    python benchmarks/bench_linear.py        # ~30 s; writes bench-results/bench_linear.{json,png} (--out PATH)
"""

from __future__ import annotations

import json
import argparse
import os
import time

import torch
import torch.nn.functional as F

OUT = os.path.join("bench-results", "bench_linear")  # a scratch folder git ignores; --out PATH elsewhere
MODEL_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
COLD_ROWS = (1, 2, 3, 4, 8, 16, 64)
HOT_SHAPES = {"smollm2 gate_up": (3072, 576), "bench-large down": (1024, 3072)}
HOT_ROWS = (1, 2, 4, 16, 64)


def mkl(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 1:
        return (w @ x.repeat(2, 1).T)[:, :1]
    return w @ x.T


def methods(ws: list[torch.Tensor]) -> dict:
    """name -> per-weight callables(x, i)."""
    plain = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]
    hinted = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in ws]
    return {
        "F.linear": lambda x, i: F.linear(x, ws[i]),
        "W@x.T": lambda x, i: mkl(x, ws[i]),
        "onednn": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, plain[i], None, "none", [], ""),
        "onednn16": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, hinted[i], None, "none", [], ""),
    }


def cold(threads: int, rounds: int = 4) -> list[dict]:
    """Best-of-rounds time of one pass over the model's weights, per method and row count.
    Methods alternate within each round so the machine's noise hits all alike."""
    torch.set_num_threads(threads)
    ws = [torch.randn(o, i) for o, i in MODEL_SHAPES]
    fns = methods(ws)
    results = []
    for rows in COLD_ROWS:
        xs = {i: torch.randn(rows, i) for i in (576, 1536)}
        best = {name: float("inf") for name in fns}
        for _ in range(rounds + 1):  # the first round warms up
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for i, w in enumerate(ws):
                    fn(xs[w.shape[1]], i)
                best[name] = min(best[name], time.perf_counter() - t0)
        r = {"rows": rows, **{k: v * 1e3 for k, v in best.items()}}
        results.append(r)
        print(f"cold, whole model, {threads} thread(s), rows {rows:3d}: " + "  ".join(f"{k} {r[k]:6.1f} ms" for k in fns), flush=True)
    return results


def median_ms(fn, n: int = 15) -> float:
    for _ in range(2):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


def hot() -> list[dict]:
    torch.set_num_threads(1)
    results = []
    for name, (out_f, in_f) in HOT_SHAPES.items():
        fns = methods([torch.randn(out_f, in_f)])
        for rows in HOT_ROWS:
            x = torch.randn(rows, in_f)
            r = {"shape": name, "rows": rows, **{k: median_ms(lambda: fn(x, 0)) for k, fn in fns.items()}}
            results.append(r)
            print(f"hot, {name:18s} rows {rows:3d}: " + "  ".join(f"{k} {r[k]:6.3f} ms" for k in fns), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT, help="path of the .json and .png, without the extension")
    out = ap.parse_args().out
    res = {"torch": torch.__version__, "load_avg": os.getloadavg(), "hot_threads": 1,
           "cold": {"2": cold(2), "1": cold(1)}, "hot": hot()}
    res["load_avg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 1 + len(HOT_SHAPES), figsize=(5 + 4 * len(HOT_SHAPES), 3.6))
    keys = ("F.linear", "W@x.T", "onednn", "onednn16")
    for i, key in enumerate(keys):
        for threads, style in (("2", "-"), ("1", "--")):
            rs = res["cold"][threads]
            axes[0].plot([r["rows"] for r in rs], [r[key] for r in rs], style, marker="o", color=f"C{i}",
                         label=f"{key}, {threads} thr")
    axes[0].set_title("cold: one pass over SmolLM2-135M's weights", fontsize=9)
    axes[0].set_ylabel("ms")
    for ax, name in zip(axes[1:], HOT_SHAPES):
        rs = [r for r in res["hot"] if r["shape"] == name]
        for key in keys:
            ax.plot([r["rows"] for r in rs], [r[key] for r in rs], marker="o", label=key)
        ax.set_yscale("log")
        ax.set_title(f"hot: {name}, 1 thread", fontsize=9)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)
    print(f"wrote {out}.json and .png")


if __name__ == "__main__":
    main()
