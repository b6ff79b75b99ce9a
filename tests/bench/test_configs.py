"""Configurations, workload and the tuning helpers, without running a model."""

import pytest

from tokenrouter.bench import configs as C
from tokenrouter.bench import tuning, workload
from tokenrouter.bench.runlengths import runs_of
from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.loader import model_facts
from tokenrouter.tuner.profile import Curve, ModelProfile, Profile


@pytest.fixture
def bench_program():
    return load_program("examples/bench.route", model_facts=model_facts)


def test_parse_configs():
    assert C.parse_configs(None) == [c for c in C.CONFIGS if c not in C.VLLM]  # the vllm extra is optional
    assert C.parse_configs("vllm") == ["tokenrouter", "tokenrouter_vllm", "vllm_large", "vllm_std"]
    assert C.parse_configs("naive,tokenrouter") == ["tokenrouter", "naive"]
    assert C.parse_configs("quick") == [c for c in C.CONFIGS if c in C.QUICK]
    assert "llamacpp_std" in C.parse_configs("quick") and "lockstep" not in C.parse_configs("quick")
    with pytest.raises(ValueError, match="unknown configuration.*fast"):
        C.parse_configs("tokenrouter,fast")


@pytest.mark.slow
def test_single_model_program_has_one_writer_and_round_trips(bench_program):
    small, large = C.small_and_large(bench_program)
    assert (small, large) == ("small", "large")
    one = C.single_model(bench_program, large)
    assert [m.name for m in one.models] == ["large"] and one.start == "large"
    assert not one.transitions and not one.bounds
    assert C.writers(one) == ["large"]
    assert ir.Program.from_json(one.to_json()) == one
    on = C.on_engine(bench_program, large, "vllm")
    assert (on.model(large).engine, on.model(small).engine) == ("vllm", "native")


def test_thresholds_per_configuration(bench_program):
    tuned = {"small": 1, "large": 5}
    assert C.thresholds_for("tokenrouter", bench_program, tuned) == tuned
    assert C.thresholds_for("no_pending", bench_program, tuned) == tuned
    assert C.thresholds_for("no_delay", bench_program, tuned) == {"small": 1, "large": 1}
    assert C.thresholds_for("naive", bench_program, tuned) == {"small": 1, "large": 1}
    assert C.thresholds_for("large_only", bench_program, tuned) is None


def test_launch_switches(bench_program):
    base = LaunchOptions(mode="thread")
    assert C.launch_options("no_pending", bench_program, base).retention == "rematch"
    naive = C.launch_options("naive", bench_program, base)
    assert naive.transport == "relay" and naive.retention == "rematch"
    assert C.launch_options("tokenrouter", bench_program, base) is base
    assert C.launch_options("lockstep", bench_program, base) is None


def test_workload():
    ps = workload.prompts(20)
    assert len(set(ps)) == 20
    assert workload.requests_for(8, 4) == 16 and workload.requests_for(1, 4) == 4
    s = workload.sampling(7)
    assert s.max_tokens == 7 and s.temperature == 0.0 and s.stop_token_ids == ()


def test_sweep_candidates_and_profile_sizes():
    assert tuning.sweep_candidates(8, 5) == [1, 2, 3, 4, 5, 6, 8]
    assert tuning.sweep_candidates(1, 1) == [1]
    assert tuning.profile_batch_sizes(8) == [1, 2, 4, 8]
    assert tuning.profile_batch_sizes(12) == [1, 2, 4, 8, 12]


def test_runs_of():
    assert runs_of(["s", "s", "l", "s", "l", "l"]) == [("s", 2), ("l", 1), ("s", 1), ("l", 2)]
    assert runs_of([]) == []


def test_predict_uses_the_tuner_and_b1_matches_no_delay(bench_program):
    prof = Profile.affine({"small": (6.0, 0.12), "large": (27.9, 0.558)}, colocation=0.5)
    p1 = tuning.predict(bench_program, prof, 1, {"small": 1, "large": 1})
    # one request: X = (E K_s - 1 + E K_l) / (E K_s L_s(1) + E K_l L_l(1)), E K_s = 20, E K_l = 1
    assert p1["tokens_per_s"] == pytest.approx(1000 * 20 / (20 * 6.0 + 27.9), rel=1e-6)
    b = tuning.tuned_thresholds(bench_program, 2, prof)
    assert b["small"] == 1 and b["large"] >= 1


def test_the_prediction_for_the_workload_counts_its_prompts(bench_program):
    """A request's prompt is fed once to each model: per request-step, prompt / request tokens
    times the committed tokens a step stands for (small: 1, large: the 20 of its cycle); and
    what it commits after a model's last visit never reaches that model (large: the small
    model's last run, ~20 of 128 tokens; small: 1/20 of a token)."""
    base = Profile.affine({"small": (6.0, 0.12), "large": (27.9, 0.558)}, colocation=0.5)
    models = {}
    for name, mp in base.models.items():  # extends: 0.3 ms more per token a request
        bs = mp.alone.batch_sizes
        ext = {k: Curve(bs, tuple(mp.alone(b) + 0.3 * (k - 1) * b for b in bs)) for k in (4, 16)}
        models[name] = ModelProfile(name, mp.alone, mp.co_located, ext)
    prof = Profile(models)
    plain = tuning.predict(bench_program, prof, 8, {"small": 1, "large": 4})
    fed = tuning.predict(bench_program, prof, 8, {"small": 1, "large": 4}, prompt_tokens=32, request_tokens=128)
    assert not plain["prefills_counted"] and fed["prefills_counted"]
    assert plain["tokens_per_request_step"] == pytest.approx({"small": 1.0, "large": 20.0})
    assert fed["tokens_per_request_step"] == pytest.approx({"small": 1.0 * (1 - 0.05 / 128) + 0.25,
                                                            "large": 20.0 * (1 - 20 / 128) + 5.0})
    assert fed["tokens_per_s"] < plain["tokens_per_s"]
