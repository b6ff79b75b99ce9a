"""The cost/quality frontier: every configuration of an evaluation as one row (small alone,
large alone, each program as written and at each sweep point), and the plot of the task
set's metric against the large model's token share and against tokens/s at each
concurrency. One program's report and the comparison of several (`compare.py`) both draw
their table and plot from these rows.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

ROW_KEYS = ("accuracy", "correct", "answered", "exact_match_with_large", "large_share", "handoffs_per_request",
            "fixed_vs_large", "broken_vs_large", "tokens_per_s", "tokens_per_s_at")
BASELINE_STYLE = {"small": ("#1f5fbf", "s"), "large": ("#d9661f", "s")}
PROGRAM_COLOURS = ("#2a9d3a", "#8e44ad", "#c0392b", "#16a085", "#7f6000", "#34495e", "#d35400", "#2c3e50")


def row(kind: str, label: str, scores: dict[str, Any], program: str | None = None, param: str | None = None,
        value: float | None = None, report: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "label": label, "program": program, "param": param, "value": value, "report": report,
            **{k: scores.get(k) for k in ROW_KEYS}}


def value(v) -> str:
    """A parameter's value as a label shows it (numbers in their shortest form)."""
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def configurations(summary: dict[str, Any], prefix: str = "", report: str | None = None) -> list[dict[str, Any]]:
    """The rows of one program's summary: small alone, large alone, routed, its sweep points
    (labels start with `prefix`, and name `report`, where several programs share a table)."""
    meta, cfg = summary["meta"], summary["configs"]
    program = meta["program"]
    bound = ", ".join(f"{k} = {value(v['value'])}" for k, v in meta.get("bound_params", {}).items())
    rows = [row("small", f"small alone ({meta['small']})", cfg["small"]),
            row("large", f"large alone ({meta['large']})", cfg["large"]),
            row("routed", f"{prefix}routed" + (f" ({bound})" if bound else ""), cfg["routed"], program, report=report)]
    sweep = summary.get("sweep") or {}
    for p in sweep.get("points") or []:
        rows.append(row("sweep", f"{prefix}{sweep['param']} = {p['value']:g}", p, program, sweep["param"], p["value"],
                        report))
    return rows


def metric_of(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> tuple[str, str]:
    """(row key, label) of what the plot's y axis shows: the task set's metric, or agreement
    with the large model where no task carries an answer."""
    if any(r["accuracy"] is not None for r in rows):
        return "accuracy", meta.get("metric", "accuracy")
    return "exact_match_with_large", "exact match with large"


def rate(r: dict[str, Any], conc) -> float | None:
    at = r.get("tokens_per_s_at") or {}
    return at.get(str(conc), r["tokens_per_s"] if not at else None)


def plot(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> tuple[bytes, str]:
    """(PNG, SVG) of the frontier. Panel 0: the metric against the large model's token share;
    panel j >= 1: against tokens/s at the j-th concurrency. In the SVG each configuration's
    marker in each panel is the element `point-PANEL-ROW` (ROW: its index in `rows`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, label = metric_of(rows, meta)
    concs = meta.get("concurrencies", [meta["concurrency"]])
    programs = list(dict.fromkeys(r["program"] for r in rows if r["program"]))
    colour = {p: PROGRAM_COLOURS[i % len(PROGRAM_COLOURS)] for i, p in enumerate(programs)}
    fig, axes = plt.subplots(1, 1 + len(concs), figsize=(4.6 * (1 + len(concs)), 4), dpi=100, squeeze=False)
    xs = [("large_share", "share of tokens written by the large model")] + \
         [(c, f"tokens/s at concurrency {c}") for c in concs]
    for j, (ax, (xkey, xlabel)) in enumerate(zip(axes[0], xs)):
        def x_of(r):
            return r["large_share"] if xkey == "large_share" else rate(r, xkey)
        for p in programs:  # each program's sweep, joined in order of its values
            pts = [r for r in rows if r["program"] == p and r["kind"] == "sweep" and x_of(r) is not None
                   and r[key] is not None]
            if len(pts) > 1:
                ax.plot([x_of(r) for r in pts], [r[key] for r in pts], "-", color=colour[p], alpha=0.5, linewidth=1)
        for i, r in enumerate(rows):
            x, y = x_of(r), r[key]
            if x is None or y is None:
                continue
            c, m = BASELINE_STYLE.get(r["kind"], (colour.get(r["program"]), "*" if r["kind"] == "routed" else "o"))
            (line,) = ax.plot([x], [y], m, color=c, markersize=12 if m == "*" else 7,
                              label=r["label"] if r["kind"] != "sweep" else None)
            line.set_gid(f"point-{j}-{i}")
            if r["kind"] == "sweep":
                ax.annotate(f"{r['value']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_ylim(-0.05, 1.05)  # every metric is a share
        if xkey == "large_share":
            ax.set_xlim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{label} against cost ({meta['n_prompts']} prompts; sweep points labelled with their value)",
                 fontsize=10)
    fig.tight_layout()
    png, svg = io.BytesIO(), io.StringIO()
    fig.savefig(png, format="png")
    fig.savefig(svg, format="svg")
    plt.close(fig)
    text = svg.getvalue()
    return png.getvalue(), text[text.index("<svg"):]
