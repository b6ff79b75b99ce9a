"""Several programs of one model pair on one page: every configuration of every program (as
written and at each sweep point) beside small alone and large alone, which are one
computation for all of them and appear once.

    tokenrouter eval a.route b.route --out DIR              # one run: DIR/a/, DIR/b/ and the comparison in DIR
    tokenrouter eval --combine DIR_A DIR_B --out DIR        # runs made apart (e.g. with --reuse), compared after

Runs compare only when they are the same experiment: the same task set (kind, prompt
wrapping, stop strings), the same prompts, `max_tokens`, chat setting and concurrencies, and
the same small and large model declarations; anything else is an `EvalError`. Small alone
and large alone are taken from the first run. The comparison's `summary.json` (`meta.runs`:
each program and its folder; `configs`: one row per configuration, `frontier.configurations`),
`frontier.png` and `report.html` (the table, with links to each program's own report, and the
plot) are written all or nothing.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any, Sequence

from tokenrouter.eval.configs import EvalError
from tokenrouter.eval.frontier import configurations, metric_of, plot
from tokenrouter.eval.report import CSS, config_table, figure, host_line, write_files
from tokenrouter.eval.reuse import computation, read_summary


def experiment(s: dict[str, Any]) -> tuple:
    """What must be equal for two runs to share a table."""
    m = s["meta"]
    return (computation(m.get("task_set")), m["max_tokens"], bool(m.get("chat_template", True)),
            m.get("concurrencies", [m["concurrency"]]), [(r["id"], r["prompt"]) for r in s["prompts"]])


def baselines(s: dict[str, Any]) -> tuple:
    m = s["meta"]
    models = m.get("models", {})
    return models.get(m["small"]), models.get(m["large"])


def comparison(runs: Sequence[tuple[str, dict[str, Any]]], command: str | None = None) -> dict[str, Any]:
    """The comparison of `runs` ((folder relative to the comparison's folder, summary) each)."""
    if not runs:
        raise EvalError("nothing to compare")
    (_, first), *rest = runs
    for folder, s in rest:
        if experiment(s) != experiment(first):
            raise EvalError(f"{folder} is not the same experiment as {runs[0][0]} (task set, prompts, max tokens, "
                            "chat template or concurrencies differ): its figures cannot share a table")
        if baselines(s) != baselines(first):
            raise EvalError(f"{folder} does not run the same small and large models as {runs[0][0]}")
    rows = configurations(first)[:2]
    for folder, s in runs:
        stem = os.path.splitext(os.path.basename(s["meta"]["program"]))[0]
        rows += configurations(s, prefix=f"{stem}: ", report=os.path.join(folder, "report.html"))[2:]
    m = first["meta"]
    meta = {"kind": "comparison", "command": command,
            "runs": [{"program": s["meta"]["program"], "folder": folder} for folder, s in runs],
            **{k: m[k] for k in ("small", "large", "n_prompts", "n_answered", "max_tokens", "concurrency", "host")},
            "concurrencies": m.get("concurrencies", [m["concurrency"]]), "metric": m.get("metric", "accuracy"),
            "task_set": m.get("task_set", {"name": "answers", "files": m.get("prompts", [])}),
            "seconds": round(sum(s["meta"].get("seconds", 0) for _, s in runs), 1)}
    return {"meta": meta, "configs": rows}


def render_comparison(cmp: dict[str, Any], svg: str) -> str:
    meta, rows = cmp["meta"], cmp["configs"]
    e = html.escape
    _, label = metric_of(rows, meta)
    programs = "".join(f'<li><a href="{e(os.path.join(r["folder"], "report.html"))}"><code>{e(r["program"])}</code>'
                       "</a></li>" for r in meta["runs"])
    return "".join([
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tokenrouter eval: {len(meta['runs'])} programs</title><style>{CSS}</style></head><body>",
        f"<h1>Is routing worth it? {len(meta['runs'])} programs of one pair</h1>",
        f"<p class='meta'>small model <b>{e(meta['small'])}</b>, large model <b>{e(meta['large'])}</b>; task set "
        f"{e(meta['task_set']['name'])}, {meta['n_prompts']} prompts, greedy, at most {meta['max_tokens']} tokens each, "
        f"concurrency {', '.join(map(str, meta['concurrencies']))}; {host_line(meta)}</p>",
        f"<p>Each program's own report: </p><ul id='programs'>{programs}</ul>",
        "<h2>Every configuration</h2>", config_table(rows, meta),
        "<h2>Frontier</h2>", figure(svg, label), "</body></html>"])


def comparison_files(cmp: dict[str, Any]) -> dict[str, bytes]:
    png, svg = plot(cmp["configs"], cmp["meta"])
    return {"summary.json": json.dumps(cmp, indent=1, ensure_ascii=False).encode(), "frontier.png": png,
            "report.html": render_comparison(cmp, svg).encode()}


def combine(folders: Sequence[str], out: str, command: str | None = None) -> dict[str, Any]:
    """Compare the runs in `folders` (each an eval's report folder) into `out`."""
    runs = []
    for folder in folders:
        s = read_summary(folder, "--combine")
        if "runs" in s["meta"]:
            raise EvalError(f"--combine {folder}: a comparison already; give the folders of its programs")
        runs.append((os.path.relpath(folder, out), s))
    cmp = comparison(runs, command)
    write_files(out, comparison_files(cmp))
    return cmp
