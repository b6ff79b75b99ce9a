"""The suite's own arithmetic: medians, percentiles, shares, breakdowns, summary keys."""

import dataclasses
import json

import pytest

from tokenrouter.bench import results as R
from tokenrouter.bench import tuning
from tokenrouter.bench.configs import CONFIGS
from tokenrouter.bench.deploy import Measurement
from tokenrouter.bench.runner import calibrated_requests, official_requests
from tokenrouter.tuner import api
from tokenrouter.tuner.profile import Curve, ModelProfile, Profile


def meas(name, wall, tokens, lat=None, outputs=None, **kw):
    return Measurement(name, 8, wall, tokens, lat, kw.pop("written_by", {"s": tokens}), outputs or [[1, 2]], **kw)


def test_percentiles_against_hand_computed_values():
    xs = [float(i) for i in range(1, 101)]  # 1..100
    assert R.percentile(xs, 50) == pytest.approx(50.5)
    assert R.percentile(xs, 99) == pytest.approx(99.01)  # 99 + 0.01 * (100 - 99)
    assert R.percentile([], 50) is None


def test_median_round_picks_the_middle_throughput_with_its_breakdown():
    a, b, c = meas("x", 10, 100), meas("x", 10, 300), meas("x", 10, 200)
    assert R.median_round([a, b, c]) is c
    assert R.median_round([a, b]) is a  # the lower of two


def test_config_result_pools_latencies_and_reports_shares():
    m1 = meas("x", 2.0, 100, [1.0, 2.0], written_by={"small": 90, "large": 10},
              phase_s={"small": {"forward": 0.6, "route": 0.2}}, steps={"small": 20}, batch_sum={"small": 80})
    m2 = meas("x", 4.0, 100, [3.0, 4.0], written_by={"small": 90, "large": 10})
    r = R.config_result([m1, m2])
    assert r["tokens_per_s"] == 25.0  # median of (50, 25) by the lower-middle rule
    assert r["rounds_tokens_per_s"] == [50.0, 25.0]
    assert r["latency_s"]["median"] == 2.5 and r["latency_s"]["requests"] == 4
    assert r["share"] == {"large": 0.1, "small": 0.9}
    assert r["step_breakdown"] == {}  # m2 (the median) has no counters
    b = R.breakdown(m1)["small"]
    assert b["ms_per_step"] == pytest.approx(40.0)  # 0.8 s over 20 steps
    assert b["mean_batch"] == 4.0
    assert b["phases"]["forward"]["share"] == pytest.approx(0.75)


def test_identical_outputs_only_compares_routed_configs():
    same = {"tokenrouter": [meas("t", 1, 1, outputs=[[1]])], "naive": [meas("n", 1, 1, outputs=[[1]])],
            "large_only": [meas("l", 1, 1, outputs=[[9]])]}
    assert R.identical_outputs(same) is True
    same["tokenrouter@2"] = [meas("t", 1, 1, outputs=[[2]])]
    assert R.identical_outputs(same) is False


def test_summary_has_exactly_the_issue_keys_per_level(tmp_path):
    lv = {"batch_thresholds": {"small": 1, "large": 3},
          "configs": {"tokenrouter": {"tokens_per_s": 30.0}, "naive": {"tokens_per_s": 10.0}}}
    s = R.summary({8: lv, 1: dict(lv, batch_thresholds={"small": 1, "large": 1})})
    assert list(s) == ["1", "8"]
    assert set(s["8"]) == set(CONFIGS) | {"B_i", "of_bound", "predicted", "of_predicted"}
    assert s["8"]["tokenrouter"] == 30.0 and s["8"]["lockstep"] is None and s["8"]["B_i"]["large"] == 3
    assert s["8"]["predicted"] is None and s["8"]["of_predicted"] is None  # no profile, no prediction
    s = R.summary({8: dict(lv, predicted={"tokenrouter": {"tokens_per_s": 40.0}})})
    assert s["8"]["predicted"] == 40.0 and s["8"]["of_predicted"] == pytest.approx(0.75)
    R.write_json(str(tmp_path / "s.json"), s)
    assert json.loads((tmp_path / "s.json").read_text()) == s


def test_ratios():
    assert R.ratios({"tokenrouter": 30.0, "naive": 10.0, "lockstep": None}) == {"tokenrouter/naive": 3.0}
    assert R.ratios({"naive": 10.0}) == {}


def test_paired_ratios_divide_within_each_round():
    # the host slows down 20% from round 1 to round 2: the median rounds' ratio (160 / 150) says
    # tokenrouter wins by 7%; each round, paired, says they tie
    by = {"tokenrouter": [meas("t", 1.0, 200), meas("t", 1.25, 200)],
          "naive": [meas("n", 1.0, 200), meas("n", 1.25, 200), meas("n", 1.0, 10)],  # a third round tokenrouter lacks
          "tokenrouter@4": [meas("s", 1.0, 100)], "lockstep": []}
    p = R.paired_ratios(by)
    assert list(p) == ["tokenrouter/naive"]
    assert p["tokenrouter/naive"] == {"rounds": [1.0, 1.0], "median": 1.0, "min": 1.0, "max": 1.0}
    by["naive"] = [meas("n", 0.5, 200), meas("n", 1.25, 250), meas("n", 1.0, 100)]
    by["tokenrouter"].append(meas("t", 1.0, 300))
    assert R.paired_ratios(by)["tokenrouter/naive"] == {"rounds": [0.5, 0.8, 3.0], "median": 0.8, "min": 0.5,
                                                        "max": 3.0}
    assert R.paired_ratios({"naive": [meas("n", 1.0, 10)]}) == {}


def test_agreement_counts_tokens_before_the_first_difference():
    ours = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    theirs = [[1, 2, 3, 4], [5, 6, 0, 8]]  # ran two requests only
    a = R.agreement(ours, theirs)
    assert a == {"requests": 2, "identical_requests": 0.5, "tokens_before_first_difference": 6 / 8}
    assert R.agreement([], [])["identical_requests"] is None


def test_identical_outputs_compares_the_requests_both_ran():
    by = {"tokenrouter": [meas("t", 1, 1, outputs=[[1], [2], [3]])], "naive": [meas("n", 1, 1, outputs=[[1], [2]])]}
    assert R.identical_outputs(by) is True
    by["naive"] = [meas("n", 1, 1, outputs=[[1], [4]])]
    assert R.identical_outputs(by) is False


def test_bound_prices_every_request_step_at_its_cheapest_batch_with_the_models_side_by_side():
    # 100 tokens: 105 request-steps on small, 5 on large, at N = 8; L(b) / b falls with b, so b = 8
    m = meas("tokenrouter", 1.0, 100, written_by={"small": 95, "large": 5}, batch_sum={"small": 105, "large": 5})
    apart = Profile.affine({"small": (6.0, 0.5), "large": (20.0, 2.0)}, colocation=0.0)
    small_ms, large_ms = 105 * apart.models["small"].step_ms(8) / 8, 5 * apart.models["large"].step_ms(8) / 8
    b = R.bound(8, apart, m)
    # nothing slows a model while the other steps: the two overlap fully, the longer one is the time
    assert b["tokens_per_s"] == pytest.approx(100 / (max(small_ms, large_ms) / 1000))
    assert b["models"]["small"]["request_steps_per_token"] == pytest.approx(1.05)
    # each runs twice as slow beside the other: overlapping gains nothing, the times add up
    shared = Profile.affine({"small": (6.0, 0.5), "large": (20.0, 2.0)}, colocation=1.0)
    assert R.bound(8, shared, m)["tokens_per_s"] == pytest.approx(100 / ((small_ms + large_ms) / 1000))
    # a step that gets dearer per request past b = 2 is priced at b = 2
    steep = Profile({"large": ModelProfile("large", Curve((1, 2, 4, 8), (10.0, 12.0, 40.0, 100.0)))})
    one = meas("tokenrouter", 1.0, 10, batch_sum={"large": 10})
    assert R.bound(8, steep, one)["tokens_per_s"] == pytest.approx(10 / (10 * 6.0 / 1000))
    assert R.bound(8, None, m) is None
    assert not b["extends_counted"]  # no fed-token counters: every request-step a decode
    assert R.of_bound({"bound": 200.0, "tokenrouter": 150.0}) == {"tokenrouter": 0.75}


def _with_extends(prof: Profile, ms_per_token: float) -> Profile:
    """`prof` with extend curves: a step of k tokens a request costs (k - 1) ms_per_token more per request."""
    models = {}
    for name, mp in prof.models.items():
        bs = mp.alone.batch_sizes
        ext = {k: Curve(bs, tuple(mp.alone(b) + (k - 1) * ms_per_token * b for b in bs)) for k in (4, 16)}
        models[name] = ModelProfile(name, mp.alone, mp.co_located, ext)
    return Profile(models)


def test_bound_counts_the_tokens_each_request_step_fed():
    """A returning request's extend and a visit's prefill cost more than a decode: the bound
    prices each model's request-steps at its mean fed tokens, so extends lower it."""
    prof = _with_extends(Profile.affine({"small": (6.0, 0.5), "large": (20.0, 2.0)}), 0.25)
    decodes = meas("tokenrouter", 1.0, 100, batch_sum={"small": 105, "large": 5})
    fed = meas("tokenrouter", 1.0, 100, batch_sum={"small": 105, "large": 5},
               fed_tokens={"small": 105 + 21, "large": 5 * 20})  # small: 1.2 a step; large: 20-token extends
    b0, b = R.bound(8, prof, decodes), R.bound(8, prof, fed)
    assert b["extends_counted"] and b["models"]["large"]["tokens_per_request_step"] == 20.0
    small, large = prof.models["small"], prof.models["large"]
    cost = max(105 * small.step_ms(8, tokens=1.2), 5 * large.step_ms(8, tokens=20.0)) / 1000 / 8
    assert b["tokens_per_s"] == pytest.approx(100 / cost)
    assert b["tokens_per_s"] < b0["tokens_per_s"]
    g = R.gap(8, prof, dataclasses.replace(fed, steps={"small": 20, "large": 5},
                                           phase_s={"small": {"forward": 0.4}, "large": {"forward": 0.1}}))
    assert g["large"]["tokens_per_request_step"] == 20.0
    assert g["large"]["profile_step_ms_at_mean_batch"] == pytest.approx(large.step_ms(1, tokens=20.0))


def test_calibrated_requests():
    assert calibrated_requests(16, 8, 128, 0.0, 0, 64) == 16  # no calibration: the base
    assert calibrated_requests(4, 8, 128, 0.0, 0, 64) == 16  # ... at least two waves
    assert calibrated_requests(16, 8, 128, 150.0, 30, 64) == 40  # 35.2 -> whole waves of 8
    assert calibrated_requests(16, 8, 128, 10_000.0, 30, 64) == 64  # capped
    assert calibrated_requests(16, 8, 128, 5.0, 30, 64) == 8  # one wave of a slow configuration


def test_official_requests_are_capped_to_whole_waves_only_when_asked():
    assert official_requests(16, 8, None) == 16  # as the others
    assert official_requests(16, 8, 1) == 8  # --long: one wave of N
    assert official_requests(16, 8, 4) == 16  # never more than the others
    assert official_requests(16, 8, 0) == 8  # at least one wave


def test_gap_splits_the_time_per_model():
    prof = Profile.affine({"small": (10.0, 1.0), "large": (40.0, 4.0)}, colocation=0.0)
    # small: 20 steps at mean batch 4 (80 request-steps), busy 0.5 s of a 1 s wall
    m = meas("tokenrouter", 1.0, 80, written_by={"small": 76, "large": 4}, batch_sum={"small": 80, "large": 4},
             steps={"small": 20, "large": 4}, phase_s={"small": {"forward": 0.5}, "large": {"forward": 0.2}})
    g = R.gap(8, prof, m)["small"]
    assert g["busy_share_of_wall"] == 0.5 and g["mean_batch"] == 4.0
    assert g["measured_step_ms"] == 25.0 and g["profile_step_ms_at_mean_batch"] == pytest.approx(13.0)
    assert g["underfill"] == pytest.approx((13.0 / 4) / (17.0 / 8))
    assert g["step_over_profile"] == pytest.approx(25.0 / 13.0)


def test_the_chain_feeds_a_finite_request_its_prompt_and_not_its_unseen_tail():
    """with_prefills on the benchmark pair's shape (small hands off with p = 0.05 and its token
    rewritten, large writes one): the steady state feeds the large model r_small = 20 tokens a
    step; a 128-token request with a 16-token prompt adds the prompt once per request (16/128
    of a cycle of 20 tokens a visit) and never feeds the large model the ~20 tokens after its
    last visit (1 - 20/128)."""
    prof = Profile.affine({"small": (6.0, 0.5), "large": (20.0, 2.0)})
    system = api.build_system(prof, 8, {"small": 0.05, "large": 1.0}, models=["small", "large"], start="small",
                              rewrite={("small", "large"): True})
    assert system.tokens_per_step["large"] == pytest.approx(20.0)
    k = tuning.with_prefills(system, 16.0, 128.0).tokens_per_step
    cycle, tail = 20.0, 20.0 * 20.0 / 20.0
    assert k["large"] == pytest.approx(20.0 * (1 - tail / 128) + 16 / 128 * cycle / 1.0)  # 19.375
    assert k["small"] == pytest.approx(1.0 * (1 - (1 / cycle) / 128) + 16 / 128 * cycle / 20.0)
    # an endless request is the steady state
    assert tuning.with_prefills(system, 0.0, 1e12).tokens_per_step["large"] == pytest.approx(20.0)
    # a request shorter than the other model's run: nothing it commits reaches the large model
    # except its prompt
    assert tuning.with_prefills(system, 16.0, 10.0).tokens_per_step["large"] == pytest.approx(16 / 10 * cycle)
