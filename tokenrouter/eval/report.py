"""One program's report: `summary.json`, the frontier plot (`frontier.png`) and `report.html`,
one static page (styles inline, the plot inline as SVG, no scripts, no external assets) with
the table of every configuration (small alone, large alone, routed, each sweep point), the
plot, the 2x2 diffs, and every prompt's routed output with each token coloured by the model
that wrote it beside the large model's output. `write_files` writes a report all or nothing.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from typing import Any, Sequence

from tokenrouter.eval.frontier import configurations, metric_of, plot, rate

# background colours per writer, in the order small, large, then any other writer
PALETTE = ("#cfe3ff", "#ffd2a8", "#d5f5d0", "#f3d0f5", "#fff3b0", "#d9d9d9")


def _fmt(v, pct=False, digits=1) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.{digits}f}"


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


def _mark(out: dict[str, Any]) -> str:
    mark = {True: '<b class="ok">right</b>', False: '<b class="bad">wrong</b>', None: "no answer"}[out["correct"]]
    detail = out.get("detail")
    return mark + (f" <span class='detail'>({html.escape(detail)})</span>" if detail and not out["correct"] else "")


def config_table(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table of every configuration (`frontier.configurations` rows): the metric, agreement
    with and churn against large alone, the large model's share, handoffs, tokens/s."""
    e = html.escape
    concs = meta.get("concurrencies", [meta["concurrency"]])
    head = (f"<tr><th>configuration</th><th>{e(meta.get('metric', 'accuracy'))}</th><th>exact match with large</th>"
            "<th>large share</th><th>handoffs per request</th><th>fixed vs large</th><th>broken vs large</th>"
            + "".join(f"<th>tokens/s at {c}</th>" for c in concs) + "</tr>")

    def metric(r):
        return "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}% ({r['correct']}/{r['answered']})"

    def name(r):
        return (f'<a href="{e(r["report"])}">{e(r["label"])}</a>' if r.get("report") else e(r["label"]))

    body = "".join(
        f'<tr data-kind="{r["kind"]}" data-row="{i}"><td>{name(r)}</td><td class="num">{metric(r)}</td>'
        f'<td class="num">{_fmt(r["exact_match_with_large"], True)}</td><td class="num">{_fmt(r["large_share"], True)}</td>'
        f'<td class="num">{_fmt(r["handoffs_per_request"], digits=2)}</td>'
        f'<td class="num">{"-" if r["fixed_vs_large"] is None else r["fixed_vs_large"]}</td>'
        f'<td class="num">{"-" if r["broken_vs_large"] is None else r["broken_vs_large"]}</td>'
        + "".join(f'<td class="num">{_fmt(rate(r, c))}</td>' for c in concs) + "</tr>"
        for i, r in enumerate(rows))
    return f"<table id='configs'>{head}{body}</table>"


def figure(svg: str, label: str) -> str:
    return (f"<figure id='frontier' role='img' aria-label='{html.escape(label)} against the large model&#39;s share "
            f"and against tokens/s'>{svg}</figure>")


def host_line(meta: dict[str, Any]) -> str:
    h = meta["host"]
    return (f"host {html.escape(h['cpu'])}, read {html.escape(str(h.get('read_gb_per_s', '?')))} GB/s, "
            f"load {html.escape(' '.join(map(str, h.get('load_average', []))))}")


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
.meta{color:#555;font-size:.9em}img,figure svg{max-width:100%;height:auto}figure{margin:0}
.q{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em;color:#333}.detail{color:#777}
"""


def render_html(summary: dict[str, Any], svg: str) -> str:
    meta = summary["meta"]
    colours = writer_colours(summary)
    e = html.escape
    rows = configurations(summary)
    _, label = metric_of(rows, meta)
    task_set = meta.get("task_set", {"name": "answers"})
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tokenrouter eval: {e(meta['program'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Is routing worth it? <code>{e(meta['program'])}</code></h1>",
        f"<p class='meta'>small model <b>{e(meta['small'])}</b>, large model <b>{e(meta['large'])}</b>; "
        f"task set {e(task_set['name'])}, {meta['n_prompts']} prompts ({meta['n_answered']} with answers), greedy, "
        f"at most {meta['max_tokens']} tokens each, concurrency {', '.join(map(str, meta.get('concurrencies', [meta['concurrency']])))}; "
        f"parameters {e(str(meta['params'] or 'defaults'))}; {host_line(meta)}</p>",
        "<h2>Every configuration</h2>", config_table(rows, meta),
        "<h2>Frontier</h2>", figure(svg, label),
        "<h2>Per-prompt diff</h2><div class='diffs'>",
        _diff_table("vs_large", "large alone", summary["diff"]["vs_large"]),
        _diff_table("vs_small", "small alone", summary["diff"]["vs_small"]), "</div>",
    ]
    legend = "".join(f'<span style="background:{c}">{e(w)}</span>' for w, c in colours.items())
    parts.append(f"<h2>Every prompt</h2><p class='legend'>token written by: {legend}</p>")
    for r in summary["prompts"]:
        div = r["first_divergence"]
        judged = (f'answer: {e(r["answer"] or "-")}{" (" + e(r["match"]) + ")" if r.get("match") else ""}'
                  if "entry_point" not in r else f"judged by its tests, <code>check({e(r['entry_point'])})</code>")
        parts.append(
            f'<section class="prompt" id="p-{e(r["id"])}" data-id="{e(r["id"])}"><h3>{e(r["id"])}</h3>'
            f'<div class="q">{e(r["prompt"])}</div><p class="meta">{judged}; small {_mark(r["small"])}, '
            f'large {_mark(r["large"])}, routed {_mark(r["routed"])}; '
            f'{"same tokens as large" if div is None else f"differs from large from token {div}"}</p>'
            f'<div class="pair"><div><b>routed</b><div class="out routed">'
            f'{_tokens(r["routed"]["pieces"], r["routed"]["writers"], colours)}</div></div>'
            f'<div><b>large alone</b><div class="out large">'
            f'{_tokens(r["large"]["pieces"], [meta["large"]] * len(r["large"]["pieces"]), colours)}</div></div></div>'
            "</section>")
    parts.append("</body></html>")
    return "".join(parts)


def report_files(summary: dict[str, Any]) -> dict[str, bytes]:
    """summary.json, frontier.png and report.html of one program's summary."""
    png, svg = plot(configurations(summary), summary["meta"])
    return {"summary.json": json.dumps(summary, indent=1, ensure_ascii=False).encode(), "frontier.png": png,
            "report.html": render_html(summary, svg).encode()}


def write_files(out: str, files: dict[str, bytes]) -> None:
    """Write `files` (name -> bytes) into `out`, all or nothing: they are written next to it
    first and moved in once complete."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".eval-", dir=parent)
    try:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        os.makedirs(out, exist_ok=True)
        for name in files:
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
