"""summary.json as Markdown tables (what `tokenrouter eval` prints when it is done, and what
docs/eval.md shows): one program's summary, or the comparison of several (`compare.py`).

    python -m tokenrouter.eval.tables out/demo/summary.json [...]
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tokenrouter.eval.frontier import rate


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _rate(c: dict[str, Any], conc) -> str:
    v = c.get("tokens_per_s_at", {}).get(str(conc), c["tokens_per_s"] if conc is None else None)
    return "-" if v is None else f"{v:.1f}"


def _churn(c: dict[str, Any]) -> list[str]:
    """Handoffs per request, fixed and broken against large alone ('-' where a summary made
    before these figures has none)."""
    h, f, b = (c.get(k) for k in ("handoffs_per_request", "fixed_vs_large", "broken_vs_large"))
    return ["-" if h is None else f"{h:.2f}", "-" if f is None else str(f), "-" if b is None else str(b)]


def markdown(summary: dict[str, Any]) -> str:
    if "runs" in summary["meta"]:
        return comparison_markdown(summary)
    meta, cfg = summary["meta"], summary["configs"]
    concs = meta.get("concurrencies", [meta["concurrency"]])
    metric = meta.get("metric", "accuracy")
    churn = "handoffs_per_request" in cfg["routed"]  # summaries made before these figures have none
    extra = ["handoffs per request", "fixed vs large", "broken vs large"] if churn else []
    head = ["configuration", metric, "exact match with large", "large share", *extra] + [f"tokens/s at {c}" for c in concs]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for k, label in (("small", f"small alone ({meta['small']})"), ("large", f"large alone ({meta['large']})"),
                     ("routed", "routed")):
        c = cfg[k]
        lines.append(f"| {label} | {_pct(c['accuracy'])} ({c['correct']}/{c['answered']}) | "
                     f"{_pct(c['exact_match_with_large'])} | {_pct(c['large_share'])} | "
                     + "".join(f"{x} | " for x in (_churn(c) if churn else []))
                     + " | ".join(_rate(c, x) for x in concs) + " |")
    lines.append("")
    lines.append("| routed against | both right | fixed | broken | both wrong |")
    lines.append("| --- | --- | --- | --- | --- |")
    for key, label in (("vs_large", "large alone"), ("vs_small", "small alone")):
        d = summary["diff"][key]
        lines.append(f"| {label} | {d['both_right']} | {d['fixed']} | {d['broken']} | {d['both_wrong']} |")
    sweep = summary.get("sweep")
    if sweep:
        head = [sweep["param"], metric, "exact match with large", "large share", *extra, f"tokens/s at {concs[0]}"]
        lines += ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for p in sweep["points"]:
            lines.append(f"| {p['value']:g} | {_pct(p['accuracy'])} | {_pct(p['exact_match_with_large'])} | "
                         f"{_pct(p['large_share'])} | " + "".join(f"{x} | " for x in (_churn(p) if churn else []))
                         + f"{p['tokens_per_s']:.1f} |")
    return "\n".join(lines)


def comparison_markdown(cmp: dict[str, Any]) -> str:
    """One row per configuration of a comparison of several programs."""
    meta = cmp["meta"]
    concs = meta["concurrencies"]
    head = ["configuration", meta["metric"], "large share", "handoffs per request", "fixed vs large",
            "broken vs large"] + [f"tokens/s at {c}" for c in concs]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in cmp["configs"]:
        metric = "-" if r["accuracy"] is None else f"{_pct(r['accuracy'])} ({r['correct']}/{r['answered']})"
        rates = ["-" if rate(r, c) is None else f"{rate(r, c):.1f}" for c in concs]
        lines.append("| " + " | ".join([r["label"], metric, _pct(r["large_share"]), *_churn(r), *rates]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            print(f"{path}:\n\n{markdown(json.load(f))}\n")
