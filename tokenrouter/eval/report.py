"""The evaluation's human-readable outputs: the frontier plot (PNG) and `report.html`, one
static page (styles inline, the plot embedded as a data URI, no scripts, no external
assets) with the summary table, the 2x2 diffs, the sweep, and every prompt's routed output
with each token coloured by the model that wrote it beside the large model's output.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

# background colours per writer, in the order small, large, then any other writer
PALETTE = ("#cfe3ff", "#ffd2a8", "#d5f5d0", "#f3d0f5", "#fff3b0", "#d9d9d9")
LABELS = {"small": "small alone", "large": "large alone", "routed": "routed"}


def frontier_png(summary: dict[str, Any]) -> bytes:
    """Accuracy (or, without answers, agreement with the large model) and tokens/s against
    the large model's token share: small alone, large alone, the routed program and every
    sweep point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = summary["configs"]
    metric = "accuracy" if cfg["large"]["accuracy"] is not None else "exact_match_with_large"
    sweep = summary.get("sweep") or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for ax, key, ylabel in ((axes[0], metric, metric.replace("_", " ")), (axes[1], "tokens_per_s", "tokens/s")):
        pts = sweep.get("points") or []
        if pts:
            ax.plot([p["large_share"] for p in pts], [p[key] or 0 for p in pts], "o-", color="#555",
                    label=f"sweep {sweep['param']}")
            for p in pts:
                ax.annotate(f"{p['value']:g}", (p["large_share"], p[key] or 0), textcoords="offset points",
                            xytext=(4, 4), fontsize=7)
        for name, colour, marker in (("small", "#1f5fbf", "s"), ("large", "#d9661f", "s"), ("routed", "#2a9d3a", "*")):
            c = cfg[name]
            ax.plot([c["large_share"]], [c[key] or 0], marker, color=colour, markersize=11 if marker == "*" else 8,
                    label=LABELS[name])
        ax.set_xlabel("share of tokens written by the large model")
        ax.set_ylabel(ylabel)
        ax.set_xlim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"cost/quality frontier (concurrency {summary['meta']['concurrency']})", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _fmt(v, pct=False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.1f}"


def writer_colours(summary: dict[str, Any]) -> dict[str, str]:
    meta = summary["meta"]
    order = [meta["small"], meta["large"]] + [w for w in meta["writers"] if w not in (meta["small"], meta["large"])]
    return {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(order)}


_CONTROL = {c: chr(0x2400 + c) for c in range(32) if chr(c) not in "\n\t"} | {0x7F: "\u2421"}


def visible(text: str) -> str:
    """Control characters (which HTML would drop or rewrite) as their Unicode control pictures."""
    return text.translate(_CONTROL)


def _tokens(pieces, writers, colours) -> str:
    out = []
    for piece, w in zip(pieces, writers):
        out.append(f'<span class="tok" data-writer="{html.escape(w)}" style="background:{colours.get(w, "#eee")}" '
                   f'title="{html.escape(w)}">{html.escape(visible(piece))}</span>')
    return "".join(out)


def _mark(c) -> str:
    return {True: '<b class="ok">right</b>', False: '<b class="bad">wrong</b>', None: "no answer"}[c]


def _diff_table(name: str, other: str, d: dict[str, Any]) -> str:
    def cell(key):
        ids = d["prompts"][key]
        links = " ".join(f'<a href="#p-{html.escape(i)}">{html.escape(i)}</a>' for i in ids)
        return f'<td class="count" data-cell="{key}">{d[key]}<div class="ids">{links}</div></td>'
    return (f'<table class="diff" id="diff-{name}"><caption>routed against {other}</caption>'
            f'<tr><th></th><th>{other} right</th><th>{other} wrong</th></tr>'
            f'<tr><th>routed right</th>{cell("both_right")}{cell("fixed")}</tr>'
            f'<tr><th>routed wrong</th>{cell("broken")}{cell("both_wrong")}</tr></table>')


CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:80em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em}td,th{border:1px solid #bbb;padding:.25em .6em;text-align:left}
td.num,td.count{text-align:right}caption{text-align:left;font-weight:bold;padding:.2em 0}
.ids{font-size:.75em;max-width:28em;text-align:left;color:#555}.diffs{display:flex;gap:2em;flex-wrap:wrap}
.prompt{border-top:1px solid #ccc;padding:.6em 0}.pair{display:flex;gap:1.2em}.pair>div{flex:1;min-width:0}
.out{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.9em;border:1px solid #ddd;padding:.4em}
.tok{border-radius:2px}.ok{color:#1a7f37}.bad{color:#b42318}.legend span{padding:.1em .5em;margin-right:.5em}
.meta{color:#555;font-size:.9em}img{max-width:100%}
"""


def render_html(summary: dict[str, Any], png: bytes) -> str:
    meta, cfg = summary["meta"], summary["configs"]
    colours = writer_colours(summary)
    e = html.escape
    extra = meta.get("concurrencies", [meta["concurrency"]])[1:]
    rows = "".join(
        f'<tr data-config="{k}"><td>{LABELS[k]}</td><td class="num">{_fmt(cfg[k]["accuracy"], True)}</td>'
        f'<td class="num">{_fmt(cfg[k]["exact_match_with_large"], True)}</td>'
        f'<td class="num">{_fmt(cfg[k]["large_share"], True)}</td><td class="num">{_fmt(cfg[k]["tokens_per_s"])}</td>'
        + "".join(f'<td class="num">{_fmt(cfg[k]["tokens_per_s_at"].get(str(c)))}</td>' for c in extra) + "</tr>"
        for k in ("small", "large", "routed"))
    extra_heads = "".join(f"<th>tokens/s at concurrency {c}</th>" for c in extra)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tokenrouter eval: {e(meta['program'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Is routing worth it? <code>{e(meta['program'])}</code></h1>",
        f"<p class='meta'>small model <b>{e(meta['small'])}</b>, large model <b>{e(meta['large'])}</b>; "
        f"{meta['n_prompts']} prompts ({meta['n_answered']} with answers), greedy, at most {meta['max_tokens']} "
        f"tokens each, concurrency {meta['concurrency']}; parameters {e(str(meta['params'] or 'defaults'))}; "
        f"host {e(meta['host']['cpu'])}, read {e(str(meta['host'].get('read_gb_per_s', '?')))} GB/s, "
        f"load {e(' '.join(map(str, meta['host'].get('load_average', []))))}</p>",
        "<h2>Summary</h2><table id='summary'><tr><th>configuration</th><th>accuracy</th>"
        f"<th>exact match with large</th><th>large share</th><th>tokens/s</th>{extra_heads}</tr>{rows}</table>",
        "<h2>Per-prompt diff</h2><div class='diffs'>",
        _diff_table("vs_large", "large alone", summary["diff"]["vs_large"]),
        _diff_table("vs_small", "small alone", summary["diff"]["vs_small"]), "</div>",
    ]
    sweep = summary.get("sweep")
    if sweep:
        srows = "".join(
            f'<tr data-value="{p["value"]:g}"><td class="num">{p["value"]:g}</td><td class="num">{_fmt(p["accuracy"], True)}</td>'
            f'<td class="num">{_fmt(p["exact_match_with_large"], True)}</td><td class="num">{_fmt(p["large_share"], True)}</td>'
            f'<td class="num">{_fmt(p["tokens_per_s"])}</td></tr>' for p in sweep["points"])
        parts.append(f"<h2>Sweep over {e(sweep['param'])}</h2><table id='sweep'><tr><th>{e(sweep['param'])}</th>"
                     "<th>accuracy</th><th>exact match with large</th><th>large share</th><th>tokens/s</th></tr>"
                     f"{srows}</table>")
    parts.append("<h2>Frontier</h2><img id='frontier' alt='cost/quality frontier' src='data:image/png;base64,"
                 + base64.b64encode(png).decode() + "'>")
    legend = "".join(f'<span style="background:{c}">{e(w)}</span>' for w, c in colours.items())
    parts.append(f"<h2>Every prompt</h2><p class='legend'>token written by: {legend}</p>")
    for r in summary["prompts"]:
        div = r["first_divergence"]
        parts.append(
            f'<section class="prompt" id="p-{e(r["id"])}" data-id="{e(r["id"])}"><h3>{e(r["id"])}</h3>'
            f'<p>{e(r["prompt"])}</p><p class="meta">answer: {e(r["answer"] or "-")}'
            f'{" (" + e(r["match"]) + ")" if r["match"] else ""}; small {_mark(r["small"]["correct"])}, '
            f'large {_mark(r["large"]["correct"])}, routed {_mark(r["routed"]["correct"])}; '
            f'{"same tokens as large" if div is None else f"differs from large from token {div}"}</p>'
            f'<div class="pair"><div><b>routed</b><div class="out routed">'
            f'{_tokens(r["routed"]["pieces"], r["routed"]["writers"], colours)}</div></div>'
            f'<div><b>large alone</b><div class="out large">'
            f'{_tokens(r["large"]["pieces"], [meta["large"]] * len(r["large"]["pieces"]), colours)}</div></div></div>'
            "</section>")
    parts.append("</body></html>")
    return "".join(parts)
