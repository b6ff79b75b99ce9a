"""One tiny run of the whole suite (thread-mode subservers, tiny random models), and
the command's handling of bad input."""

import json
import os

import pytest

from tests.helpers import vllm
from tokenrouter import cli
from tokenrouter.bench import plots, results
from tokenrouter.bench.configs import CONFIGS, PEERS_ROUTED
from tokenrouter.bench.runlengths import collect
from tokenrouter.bench.runner import BenchOptions, run_bench
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.loader import model_facts
from tokenrouter.tuner.profile import Profile

ROUTE = """tokenrouter 1
model small = "{slm}"
model large = "{llm}"
route {{
  start small
  small -> large when bernoulli(0.25, 7) rewrite
  visit large max 1 then small
}}
serve {{
  batch large = auto
  max_wait = 20ms
}}
"""


@pytest.fixture(scope="module")
def route_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("route")
    # models every configuration runs, vLLM's included (its CPU attention wants head sizes
    # of 32, 64, ...: the `pair` fixture's 8 and 12 run on AVX2 hosts only)
    pair = {"slm": vllm.write_model(str(d / "slm"), seed=1), "llm": vllm.write_model(str(d / "llm"), seed=2, layers=3)}
    path = d / "tiny.route"
    path.write_text(ROUTE.format(**pair))
    # large steps 4x the small ones; co-location slows both by half
    Profile.affine({"small": (1.0, 0.05), "large": (4.0, 0.2)}, colocation=0.5).save(d / "profile.json")
    return str(path), str(d / "profile.json")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_configuration_runs_side_by_side(route_file, tmp_path, monkeypatch):
    path, prof = route_file
    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "cache"))  # the peers' GGUF exports go here
    opts = BenchOptions(file=path, concurrency=[1, 2], requests=2, max_tokens=6, rounds=1, sweep=[2],
                        profile=prof, progress=False, mode="thread", steady_s=0.05)
    details, summary = run_bench(opts)
    assert list(summary) == ["1", "2"]
    for n, row in summary.items():
        assert set(row) == set(CONFIGS) | {"B_i", "of_bound", "predicted", "of_predicted"}
        assert all(row[c] > 0 for c in CONFIGS)
        assert row["of_bound"]["tokenrouter"] == pytest.approx(row["tokenrouter"] / row["bound"])
        assert set(row["B_i"]) == {"small", "large"}
    for n, lv in details["levels"].items():
        assert lv["identical_outputs"] is True  # a schedule never changes tokens
        tr = lv["configs"]["tokenrouter"]
        assert tr["tokens"] == lv["requests"]["tokenrouter"] * 6
        assert set(tr["written_by"]) <= {"small", "large"} and sum(tr["written_by"].values()) == tr["tokens"]
        assert lv["configs"]["large_only"]["share"] == {"large": 1.0}
        assert lv["configs"]["small_only"]["share"] == {"small": 1.0}
        assert tr["latency_s"]["p99"] >= tr["latency_s"]["median"] > 0
        assert lv["configs"]["lockstep"]["latency_s"] is None
        assert "forward" in tr["step_breakdown"]["small"]["phases"]
        assert lv["configs"]["naive"]["batch_threshold"] == {"small": 1, "large": 1}
        assert lv["configs"]["tokenrouter"]["batch_threshold"] == lv["batch_thresholds"]
        assert lv["predicted"]["tokenrouter"]["tokens_per_s"] > 0
        # the peers ran the same routing program on other kernels, at --parallel N
        for peer in PEERS_ROUTED:
            agree = lv["peer_agreement"][peer]
            # other float32 kernels: mostly the same tokens (exactness on fixed prompts: test_llamacpp.py)
            assert agree["requests"] == min(lv["requests"][peer], lv["requests"]["tokenrouter"]), peer
            assert agree["tokens_before_first_difference"] > 0.5, peer
            assert sum(lv["configs"][peer]["written_by"].values()) == lv["configs"][peer]["tokens"]
        assert lv["configs"]["llamacpp_large"]["share"] == {"large": 1.0}
        b = lv["configs"]["bound"]["bound"]
        steps = {w: v["request_steps_per_token"] * tr["tokens"] for w, v in b["models"].items()}
        assert set(steps) == {"small", "large"}
        assert steps["small"] > 0 and steps["large"] > 0  # the runtime's step counters (read as the run ends)
        assert b["extends_counted"] and b["models"]["large"]["tokens_per_request_step"] > 1  # prefills, extends
        assert lv["load_average"]["before"] is not None
    sw = details["levels"]["2"]["sweep"]
    assert [p["B"] for p in sw["points"]] == [1, 2]
    results.write_json(str(tmp_path / "details.json"), details)
    json.loads((tmp_path / "details.json").read_text())
    for p in plots.plot_all(details, str(tmp_path)):
        assert os.path.getsize(p) > 1000


@pytest.mark.slow
def test_runlengths_account_for_every_token(route_file):
    """Each small run ends in a rewritten token except a run cut by the end of the
    request; large visits write one kept token each."""
    program = load_program(route_file[0], model_facts=model_facts)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    complete, last, outs = collect(program, prompts, max_tokens=12, concurrency=2)
    assert all(k == 1 for k in complete.get("large", []) + last.get("large", []))
    small_written = sum(o.tokens_by_model.get("small", 0) for o in outs)
    large_written = sum(o.tokens_by_model.get("large", 0) for o in outs)
    assert small_written == sum(complete["small"]) - len(complete["small"]) + sum(last.get("small", []))
    assert large_written == len(complete.get("large", [])) + len(last.get("large", []))
    assert sum(len(v) for v in last.values()) == len(prompts)


@pytest.mark.parametrize("argv,msg", [
    (["--concurrency", "1,x"], "--concurrency must be comma-separated integers"),
    (["--concurrency", "0"], "--concurrency must be >= 1"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--configs", "tokenrouter,turbo"], "unknown configuration"),
    (["--sweep", "4", "--concurrency", "8"], "--sweep levels [4]"),
    (["--model", "oops"], "--model takes NAME=PATH"),
    (["--profile", "/nonexistent.json"], "no such profile"),
    (["--quick", "--long"], "choose one"),
    (["--steady-s", "-1"], "--steady-s must be >= 0"),
    (["--configs", "quick,fast"], "unknown configuration"),
])
def test_bad_input_is_a_clear_error(argv, msg, capsys):
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_missing_or_broken_program(tmp_path, capsys):
    assert cli.main(["bench", str(tmp_path / "nope.route")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.route"
    bad.write_text("tokenrouter 1\nmodel a = \n")
    assert cli.main(["bench", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err and "Traceback" not in err
