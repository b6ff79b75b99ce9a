"""report.html in a real headless Chromium: what a person sees (the rendered table rows, the
2x2 counts, the plot, the colour of every routed token) agrees with summary.json."""

import json

import pytest

from tests.helpers.cdp import Browser, chromium_path
from test_eval import run_eval
from tokenrouter.eval.report import visible

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(chromium_path() is None, reason="needs chromium (scripts/setup.sh installs it)")]

SEEN = r"""(() => {
  const rows = t => [...document.querySelectorAll(t + ' tr')].map(r => [...r.cells].map(c => c.innerText.trim()));
  const legend = {};
  for (const s of document.querySelectorAll('.legend span')) legend[getComputedStyle(s).backgroundColor] = s.innerText;
  const prompts = [...document.querySelectorAll('section.prompt')].map(sec => ({
    id: sec.dataset.id,
    routed: [...sec.querySelectorAll('.routed .tok')].map(s => ({
      by: legend[getComputedStyle(s).backgroundColor], text: s.textContent,
      shown: s.textContent === '' || s.getClientRects().length > 0})),
    routedText: sec.querySelector('.routed').textContent,
    largeText: sec.querySelector('.large').textContent}));
  const img = document.getElementById('frontier');
  return {summary: rows('#summary'), vsLarge: rows('#diff-vs_large'), vsSmall: rows('#diff-vs_small'),
          legend, prompts, img: [img.complete, img.naturalWidth, img.getBoundingClientRect().width],
          external: [...document.querySelectorAll('[src],[href]')].map(e => e.getAttribute('src') || e.getAttribute('href'))
                      .filter(u => !u.startsWith('data:') && !u.startsWith('#'))};
})()"""


def test_the_report_shows_the_summary_and_who_wrote_each_token(tmp_path, pair):
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.3")
    with Browser() as b:
        seen = b.evaluate(b.open((tmp_path / "out" / "report.html").as_uri()), SEEN)
    c = s["configs"]
    assert seen["summary"][0] == ["configuration", "accuracy", "exact match with large", "large share", "tokens/s"]
    assert [r[0] for r in seen["summary"][1:]] == ["small alone", "large alone", "routed"]
    for row, key in zip(seen["summary"][1:], ("small", "large", "routed")):
        assert row[1] == f"{100 * c[key]['accuracy']:.1f}%" and row[3] == f"{100 * c[key]['large_share']:.1f}%"
        assert row[4] == f"{c[key]['tokens_per_s']:.1f}"
    for table, key in ((seen["vsLarge"], "vs_large"), (seen["vsSmall"], "vs_small")):
        d = s["diff"][key]
        counts = [[int(cell.split()[0]) for cell in row[1:]] for row in table[1:]]
        assert counts == [[d["both_right"], d["fixed"]], [d["broken"], d["both_wrong"]]]
    assert seen["img"][0] and seen["img"][1] > 0 and seen["img"][2] > 0
    assert seen["external"] == []
    assert set(seen["legend"].values()) == {"slm", "llm"}  # one distinct colour per writer
    by_id = {p["id"]: p for p in seen["prompts"]}
    assert list(by_id) == [r["id"] for r in s["prompts"]]
    for r in s["prompts"]:
        p = by_id[r["id"]]
        assert [t["by"] for t in p["routed"]] == r["routed"]["writers"]  # colour -> writer, token by token
        assert all(t["shown"] for t in p["routed"])
        assert p["routedText"] == visible(r["routed"]["text"]) and p["largeText"] == visible(r["large"]["text"])
