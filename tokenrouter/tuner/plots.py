"""The tuner's plot: predicted throughput against the batch threshold, with the bound."""

from __future__ import annotations

from pathlib import Path


def plot_curve(result, path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bs = [p.batch[result.searched] for p in result.curve]
    xs = [p.throughput for p in result.curve]
    lat = [p.latency_ms_per_token for p in result.curve]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(bs, xs, "o-", label="predicted throughput")
    ax.axhline(result.upper_bound, color="grey", ls="--", label=f"upper bound ({result.upper_bound:.0f})")
    b_star = result.best.batch[result.searched]
    ax.plot([b_star], [result.best.throughput], "r*", ms=14, label=f"B* = {b_star}")
    ax.set_xlabel(f"batch threshold B of {result.searched}")
    ax.set_ylabel("committed tokens / s")
    ax.set_ylim(0, max(result.upper_bound, max(xs)) * 1.08)
    ax2 = ax.twinx()
    ax2.plot(bs, lat, "s:", color="tab:green", ms=3, label="ms per token per request")
    ax2.set_ylabel("ms per token (per request)", color="tab:green")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right", fontsize=8)
    ax.set_title(title or f"N = {result.concurrency}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
