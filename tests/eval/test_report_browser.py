"""report.html in a real headless Chromium: what a person sees (the rendered table of every
configuration, the 2x2 counts, every configuration's point on the plot, the colour of every
routed token) agrees with summary.json; and the comparison page of several programs shows
every configuration of each, with links to their own reports."""

import json
import os

import pytest

from tests.helpers.cdp import Browser, chromium_path
from tests.eval.test_eval import run_eval, run_programs
from tokenrouter.eval.frontier import configurations
from tokenrouter.eval.report import visible

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(chromium_path() is None, reason="needs chromium (scripts/setup.sh installs it)")]

TABLES = r"""
  const rows = t => [...document.querySelectorAll(t + ' tr')].map(r => [...r.cells].map(c => c.innerText.trim()));
  const points = {};
  for (const g of document.querySelectorAll('#frontier svg [id^="point-"]')) {
    const b = g.getBoundingClientRect();
    points[g.id] = [b.x + b.width / 2, b.y + b.height / 2, b.width > 0 && b.height > 0];
  }
  const svg = document.querySelector('#frontier svg').getBoundingClientRect();
  const external = [...document.querySelectorAll('[src],[href]')].map(e => e.getAttribute('src') || e.getAttribute('href'))
                      .filter(u => !u.startsWith('data:') && (/^[a-z][a-z0-9+.-]*:/i.test(u) || u.startsWith('//')));
"""
SEEN = "(() => {" + TABLES + r"""
  const legend = {};
  for (const s of document.querySelectorAll('.legend span')) legend[getComputedStyle(s).backgroundColor] = s.innerText;
  const prompts = [...document.querySelectorAll('section.prompt')].map(sec => ({
    id: sec.dataset.id,
    routed: [...sec.querySelectorAll('.routed .tok')].map(s => ({
      by: legend[getComputedStyle(s).backgroundColor], text: s.textContent,
      shown: s.textContent === '' || s.getClientRects().length > 0})),
    routedText: sec.querySelector('.routed').textContent,
    largeText: sec.querySelector('.large').textContent}));
  return {configs: rows('#configs'), vsLarge: rows('#diff-vs_large'), vsSmall: rows('#diff-vs_small'),
          legend, prompts, points, svg: [svg.width, svg.height], external, scripts: document.scripts.length};
})()"""
COMPARED = "(() => {" + TABLES + r"""
  const links = [...document.querySelectorAll('#configs a, #programs a')].map(a => a.getAttribute('href'));
  return {configs: rows('#configs'), points, svg: [svg.width, svg.height], external, links};
})()"""


def pct(v):
    return f"{100 * v:.1f}%"


def check_table_and_plot(seen, rows, concs):
    """Every configuration is a row of the table with its figures, and a point in every panel
    of the plot, placed in the order of its figures."""
    assert seen["configs"][0] == (["configuration", "accuracy", "exact match with large", "large share",
                                   "handoffs per request", "fixed vs large", "broken vs large"]
                                  + [f"tokens/s at {c}" for c in concs])
    assert [r[0] for r in seen["configs"][1:]] == [r["label"] for r in rows]
    for cells, r in zip(seen["configs"][1:], rows):
        assert cells[1] == f"{pct(r['accuracy'])} ({r['correct']}/{r['answered']})"
        assert cells[3] == pct(r["large_share"]) and cells[4] == f"{r['handoffs_per_request']:.2f}"
        assert cells[5:7] == [str(r["fixed_vs_large"]), str(r["broken_vs_large"])]
        assert cells[7:] == [f"{r['tokens_per_s_at'][str(c)]:.1f}" for c in concs]
    assert seen["svg"][0] > 0 and seen["svg"][1] > 0
    for panel, xkey in enumerate(["large_share"] + [str(c) for c in concs]):
        pts = [seen["points"][f"point-{panel}-{i}"] for i in range(len(rows))]  # one per configuration
        assert all(p[2] for p in pts)
        xs = [r["large_share"] if xkey == "large_share" else r["tokens_per_s_at"][xkey] for r in rows]
        ys = [r["accuracy"] for r in rows]
        for i in range(len(rows)):
            for j in range(len(rows)):
                if xs[i] < xs[j] - 1e-6 * max(1, abs(xs[j])):
                    assert pts[i][0] < pts[j][0] + 0.5, (panel, rows[i]["label"], rows[j]["label"])
                if ys[i] < ys[j] - 1e-9:
                    assert pts[i][1] > pts[j][1] - 0.5  # y grows upwards
    assert seen["external"] == []  # nothing fetched from elsewhere (links to other local reports aside)


def test_the_report_shows_every_configuration_and_who_wrote_each_token(tmp_path, pair):
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > tau", concurrency=[4, 1], sweep="tau=0.2:0.6:3")
    with Browser() as b:
        seen = b.evaluate(b.open((tmp_path / "out" / "report.html").as_uri()), SEEN)
    rows = configurations(s)
    assert [r["kind"] for r in rows] == ["small", "large", "routed", "sweep", "sweep", "sweep"]
    check_table_and_plot(seen, rows, [4, 1])
    assert seen["scripts"] == 0
    for table, key in ((seen["vsLarge"], "vs_large"), (seen["vsSmall"], "vs_small")):
        d = s["diff"][key]
        counts = [[int(cell.split()[0]) for cell in row[1:]] for row in table[1:]]
        assert counts == [[d["both_right"], d["fixed"]], [d["broken"], d["both_wrong"]]]
    assert set(seen["legend"].values()) == {"slm", "llm"}  # one distinct colour per writer
    by_id = {p["id"]: p for p in seen["prompts"]}
    assert list(by_id) == [r["id"] for r in s["prompts"]]
    for r in s["prompts"]:
        p = by_id[r["id"]]
        assert [t["by"] for t in p["routed"]] == r["routed"]["writers"]  # colour -> writer, token by token
        assert all(t["shown"] for t in p["routed"])
        assert p["routedText"] == visible(r["routed"]["text"]) and p["largeText"] == visible(r["large"]["text"])


def test_the_comparison_page_shows_every_program_and_links_their_reports(tmp_path, pair):
    cmp = run_programs(tmp_path, pair)
    out = tmp_path / "out"
    with Browser() as b:
        seen = b.evaluate(b.open((out / "report.html").as_uri()), COMPARED)
    check_table_and_plot(seen, cmp["configs"], cmp["meta"]["concurrencies"])
    assert sum(r[0].startswith("small alone") for r in seen["configs"]) == 1  # the baselines once
    for link in seen["links"]:
        assert (out / link).is_file(), link
    assert {os.path.dirname(link) for link in seen["links"]} == {r["folder"] for r in cmp["meta"]["runs"]}
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(cmp))
