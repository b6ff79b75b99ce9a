"""summary.json as Markdown tables (what `tokenrouter eval` prints when it is done, and what
docs/eval.md shows).

    python -m tokenrouter.eval.tables out/demo/summary.json [...]
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _rate(c: dict[str, Any], conc) -> str:
    v = c.get("tokens_per_s_at", {}).get(str(conc), c["tokens_per_s"] if conc is None else None)
    return "-" if v is None else f"{v:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    meta, cfg = summary["meta"], summary["configs"]
    concs = meta.get("concurrencies", [meta["concurrency"]])
    head = ("| configuration | accuracy | exact match with large | large share | "
            + " | ".join(f"tokens/s at {c}" for c in concs) + " |")
    lines = [head, "|" + " --- |" * (4 + len(concs))]
    for k, label in (("small", f"small alone ({meta['small']})"), ("large", f"large alone ({meta['large']})"),
                     ("routed", "routed")):
        c = cfg[k]
        lines.append(f"| {label} | {_pct(c['accuracy'])} ({c['correct']}/{c['answered']}) | "
                     f"{_pct(c['exact_match_with_large'])} | {_pct(c['large_share'])} | "
                     + " | ".join(_rate(c, x) for x in concs) + " |")
    lines.append("")
    lines.append("| routed against | both right | fixed | broken | both wrong |")
    lines.append("| --- | --- | --- | --- | --- |")
    for key, label in (("vs_large", "large alone"), ("vs_small", "small alone")):
        d = summary["diff"][key]
        lines.append(f"| {label} | {d['both_right']} | {d['fixed']} | {d['broken']} | {d['both_wrong']} |")
    sweep = summary.get("sweep")
    if sweep:
        lines += ["", f"| {sweep['param']} | accuracy | exact match with large | large share | tokens/s at {concs[0]} |",
                  "| --- | --- | --- | --- | --- |"]
        for p in sweep["points"]:
            lines.append(f"| {p['value']:g} | {_pct(p['accuracy'])} | {_pct(p['exact_match_with_large'])} | "
                         f"{_pct(p['large_share'])} | {p['tokens_per_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            print(f"{path}:\n\n{markdown(json.load(f))}\n")
