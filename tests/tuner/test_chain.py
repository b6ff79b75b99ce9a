"""The Markov chain against closed forms, the simulator, and the design study."""

import numpy as np
import pytest

from tokenrouter.tuner import dtmc
from tokenrouter.tuner.api import build_system, choose_batch_thresholds, predict, tune
from tokenrouter.tuner.bounds import upper_bound
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.runlength import PhaseType, fit
from tokenrouter.tuner.simulate import simulate
from tokenrouter.tuner.system import System


def pair(profile, n, p_sl, p_ls, **kw):
    return System.two_models(profile, "slm", "llm", n, p_sl, p_ls, **kw)


def test_stationary_distribution_is_a_distribution(paper_profile):
    s = pair(paper_profile, 4, 0.2, 0.5, batch={"llm": 2}, max_wait_ms={"llm": 15.0})
    states, P, _, _ = dtmc.ChainBuilder(s, 1.5, 10_000).build()
    assert np.allclose(np.asarray(P.sum(1)).ravel(), 1.0)  # rows are probability vectors
    pi = dtmc.stationary(P)
    assert pi.sum() == pytest.approx(1.0) and (pi >= 0).all()
    assert np.abs(pi @ P - pi).max() < 1e-10


@pytest.mark.parametrize("B,c", [(1, 0.0), (1, 1.0), (2, 0.5)])
def test_one_request_closed_form(B, c):
    prof = Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=c)
    s = pair(prof, 1, 0.1, 0.5, batch={"llm": B})  # one request: batching and co-location cannot matter
    m_s, m_l = 10.0, 2.0
    expected = (m_s - 1 + m_l) / (m_s * 6.0 + m_l * 27.9) * 1000  # the rewritten token commits nothing
    assert dtmc.solve(s).throughput == pytest.approx(expected, rel=1e-9)


def test_one_request_phase_type_closed_form(paper_profile):
    rl = {"slm": PhaseType.mixture([0.5, 0.5], [0.9, 0.05]), "llm": PhaseType.mixture([0.8, 0.2], [1.0, 0.25])}
    s = pair(paper_profile, 1, 0.1, 1.0, runlength=rl, rewrite=False)
    m_s, m_l = rl["slm"].mean(), rl["llm"].mean()
    expected = (m_s + m_l) / (m_s * 6.0 + m_l * 27.9) * 1000
    assert dtmc.solve(s).throughput == pytest.approx(expected, rel=1e-9)


def test_no_handoffs_is_the_small_model_alone(paper_profile):
    s = pair(paper_profile, 6, 0.0, 1.0, batch={"llm": 3})
    r = dtmc.solve(s)
    assert r.throughput == pytest.approx(6 / (6.0 + 0.12 * 5) * 1000, rel=1e-9)
    assert r.utilisation["llm"] == 0.0 and r.mean_batch["slm"] == pytest.approx(6)
    assert upper_bound(s) == pytest.approx(r.throughput)  # fully batched, nothing to wait for


def test_lockstep_closed_form(paper_profile):
    # every token switches model: all 3 requests move together, the models never overlap
    s = pair(paper_profile, 3, 1.0, 1.0, rewrite=False)
    expected = 2 * 3 / ((6.0 + 0.12 * 2) + (27.9 + 0.558 * 2)) * 1000
    assert dtmc.solve(s).throughput == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("n,B,c,p,kw", [
    (4, 2, 0.5, (0.1, 1.0), {}),
    (6, 3, 1.0, (0.2, 0.5), {"max_wait_ms": {"llm": 30.0}, "rewrite": False}),
    (5, 1, 0.0, (0.15, 0.6), {"colocated": False}),
])
def test_chain_matches_the_simulator_within_3_percent(n, B, c, p, kw):
    prof = Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=c)
    s = pair(prof, n, *p, batch={"llm": B}, **kw)
    chain = dtmc.solve(s)
    sim = simulate(s, tokens=150_000, seed=11)
    assert abs(chain.throughput / sim.throughput - 1) < 0.03, (chain.throughput, sim.throughput, sim.ci95)
    assert chain.mean_batch["llm"] == pytest.approx(sim.mean_batch["llm"], rel=0.05)


def best_b(c: float, n: int = 6, p: float = 0.1) -> int:
    prof = Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=c)
    xs = [dtmc.solve(pair(prof, n, p, 1.0, batch={"llm": b}), resolution=3).throughput for b in range(1, n + 1)]
    return int(np.argmax(xs)) + 1


def test_best_threshold_grows_with_the_colocation_slowdown():
    bs = [best_b(c) for c in (0.0, 0.5, 1.0)]
    assert bs[0] <= bs[1] <= bs[2] and bs[2] > bs[0], bs


def test_upper_bound_is_above_every_prediction(paper_profile):
    s = pair(paper_profile, 4, 0.2, 1.0)
    res = tune(s)
    assert all(p.throughput <= res.upper_bound for p in res.curve)
    assert res.best.throughput == max(p.throughput for p in res.curve)


@pytest.mark.slow
def test_bursty_run_lengths_phase_type_beats_geometric(paper_profile):
    rng = np.random.default_rng(1)
    obs = {"slm": PhaseType.mixture([0.6, 0.4], [0.8, 0.03]).sample(rng, 20000).tolist(),
           "llm": PhaseType.mixture([0.7, 0.3], [1.0, 0.15]).sample(rng, 20000).tolist()}
    geo = pair(paper_profile, 4, 1 / np.mean(obs["slm"]), 1 / np.mean(obs["llm"]), batch={"llm": 4})
    ph = geo.with_runlength({m: fit(v) for m, v in obs.items()})
    sim = simulate(geo, observed=obs, tokens=300_000, seed=2).throughput
    err_geo = abs(dtmc.solve(geo).throughput / sim - 1)
    err_ph = abs(dtmc.solve(ph).throughput / sim - 1)
    print(f"geometric chain error {err_geo:.1%}, phase-type chain error {err_ph:.1%}")
    assert err_ph < 0.02 and err_geo > 4 * err_ph


@pytest.mark.slow
def test_api_chooses_the_argmax_and_falls_back_to_simulation(paper_profile):
    b = choose_batch_thresholds(paper_profile, 4, (0.2, 1.0), rewrite={("slm", "llm"): True})
    s = build_system(paper_profile, 4, (0.2, 1.0), rewrite={("slm", "llm"): True})
    xs = {k: dtmc.solve(s.with_batch({"llm": k})).throughput for k in range(1, 5)}
    assert b == {"slm": 1, "llm": max(xs, key=xs.get)}
    p = predict(s.with_batch({"llm": 2}), max_states=5)
    assert p.method == "simulation" and p.throughput == pytest.approx(xs[2], rel=0.03)
    # observed run lengths replace the routing probability
    b2 = choose_batch_thresholds(paper_profile, 3, {"llm": 1.0}, runlengths={"slm": [3, 5, 1, 9, 2]})
    assert set(b2) == {"slm", "llm"}


def test_bad_inputs_raise_value_errors(paper_profile):
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        build_system(paper_profile, 4, {"slm": {"llm": 0.7}, "llm": {"slm": 1.5}})
    with pytest.raises(ValueError, match="no model"):
        build_system(paper_profile, 4, (0.1, 1.0), models=["slm", "xl"])
    with pytest.raises(ValueError, match="concurrency"):
        build_system(paper_profile, 0, (0.1, 1.0))
