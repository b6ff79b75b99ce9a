"""PNG plots of a bench run: throughput per configuration and level, the per-step
breakdown at the highest level, and (when swept) measured vs predicted throughput over B."""

from __future__ import annotations

import os
from typing import Any

from tokenrouter.runtime.metrics import PHASES

from tokenrouter.bench.configs import CONFIGS


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_all(details: dict[str, Any], out_dir: str) -> list[str]:
    paths = [plot_throughput(details, os.path.join(out_dir, "throughput.png")),
             plot_breakdown(details, os.path.join(out_dir, "step_breakdown.png"))]
    if any("sweep" in lv for lv in details["levels"].values()):
        paths.append(plot_sweep(details, os.path.join(out_dir, "sweep.png")))
    return paths


def plot_throughput(details: dict[str, Any], path: str) -> str:
    plt = _plt()
    levels = list(details["levels"])
    names = [c for c in CONFIGS if any(c in lv["configs"] for lv in details["levels"].values())]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(levels) + 4), 4))
    width = 0.8 / max(1, len(names))
    for i, c in enumerate(names):
        xs = [k + i * width for k in range(len(levels))]
        ys = [details["levels"][n]["configs"].get(c, {}).get("tokens_per_s", 0.0) for n in levels]
        ax.bar(xs, ys, width, label=c)
    ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(levels))])
    ax.set_xticklabels([f"N = {n}" for n in levels])
    ax.set_ylabel("committed tokens / s")
    ax.set_title(f"{os.path.basename(details['program'])}: throughput by configuration")
    ax.legend(fontsize=8, ncol=2)
    return _save(plt, fig, path)


def plot_breakdown(details: dict[str, Any], path: str) -> str:
    """ms per step by phase, per configuration and writer, at the highest level."""
    plt = _plt()
    n = list(details["levels"])[-1]
    bars = []
    for c, res in details["levels"][n]["configs"].items():
        for w, b in (res.get("step_breakdown") or {}).items():
            bars.append((f"{c}\n{w}", b["phases"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(bars) + 2), 4.5))
    bottom = [0.0] * len(bars)
    for p in PHASES:
        vals = [ph.get(p, {}).get("ms_per_step", 0.0) for _, ph in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=p)
        bottom = [a + b for a, b in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([lbl for lbl, _ in bars], fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("ms per step")
    ax.set_title(f"per-step breakdown, N = {n}")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_sweep(details: dict[str, Any], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, lv in details["levels"].items():
        sw = lv.get("sweep")
        if not sw:
            continue
        bs = [p["B"] for p in sw["points"]]
        line, = ax.plot(bs, [p["tokens_per_s"] for p in sw["points"]], "o-", label=f"measured, N = {n}")
        pred = [p["predicted_tokens_per_s"] for p in sw["points"]]
        if all(x is not None for x in pred):
            ax.plot(bs, pred, "--", color=line.get_color(), label=f"predicted (chain), N = {n}")
        ax.axvline(sw["tuned_B"], color=line.get_color(), alpha=0.3)
        ax.set_xlabel(f"B of {sw['model']}")
    ax.set_ylabel("committed tokens / s")
    ax.set_title("delayed batching: measured sweep vs the tuner (vertical: tuned B)")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _save(plt, fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
