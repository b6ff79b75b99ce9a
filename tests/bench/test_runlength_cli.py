"""`tokenrouter bench runlength-check`: a subcommand of `bench` with its own options, next to
bench's optional FILE (the check itself measures for minutes; here it is replaced)."""

import pytest

from tokenrouter import cli
from tokenrouter.bench import runlength_check


def _fake_doc(opts):
    pt = {"tokens_per_s": 90.0, "method": "chain", "error_vs_measured": -0.1}
    return {"measured": {"tokens_per_s": 100.0, "rounds_tokens_per_s": [99.0, 101.0], "share": {"slm": 0.8}},
            "batch": {"slm": 1, "llm": opts.batch or 4},
            "runlengths": {"slm": {"count": 3, "mean": 2.0, "max": 3, "fitted": {"kind": "geometric"}}},
            "predictions": {"geometric": pt}}


def test_runlength_check_is_a_bench_subcommand(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(runlength_check, "runlength_check", lambda opts: seen.append(opts) or _fake_doc(opts))
    assert cli.main(["bench", "runlength-check", "x.route", "--concurrency", "4", "--batch", "2"]) == 0
    (opts,) = seen
    assert (opts.file, opts.concurrency, opts.batch, opts.requests, opts.out) == ("x.route", 4, 2, 16,
                                                                                   "bench-results/runlengths")
    out = capsys.readouterr().out
    assert "x.route, N = 4, B = {'slm': 1, 'llm': 2}; measured 100.0 tok/s" in out
    assert "geometric" in out and "-10.0% vs measured" in out


def test_runlength_check_options_are_its_own(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "runlength-check", "--quick"])  # a bench option, not the check's
    assert e.value.code == 2
    assert "tokenrouter bench runlength-check" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "tokenrouter bench runlength-check --help" in capsys.readouterr().out
