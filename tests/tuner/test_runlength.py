import json

import numpy as np
import pytest

from tokenrouter.tuner.runlength import (PhaseType, RunLengthError, fit, fit_geometric, fit_mixture,
                                         load_traces, save_traces)


def test_pmf_and_mean_match_the_closed_forms():
    d = PhaseType.mixture([0.3, 0.7], [0.5, 0.1])
    k = np.arange(1, 400)
    expected = 0.3 * 0.5 * 0.5 ** (k - 1) + 0.7 * 0.1 * 0.9 ** (k - 1)
    assert np.allclose(d.pmf(k), expected)
    assert d.mean() == pytest.approx(0.3 / 0.5 + 0.7 / 0.1)
    assert PhaseType.geometric(0.25).mean() == pytest.approx(4.0)
    assert PhaseType.geometric(0.0).mean() == float("inf")


def test_em_recovers_a_known_two_phase_distribution():
    rng = np.random.default_rng(3)
    true = PhaseType.mixture([0.6, 0.4], [0.7, 0.04])
    x = true.sample(rng, 20000)
    d = fit(x)
    assert d.phases == 2
    p = 1 - np.diag(np.asarray(d.T))
    assert d.alpha[0] == pytest.approx(0.6, abs=0.03) and d.alpha[1] == pytest.approx(0.4, abs=0.03)
    assert p[0] == pytest.approx(0.7, abs=0.04) and p[1] == pytest.approx(0.04, abs=0.005)
    assert d.mean() == pytest.approx(x.mean(), rel=0.01)  # EM keeps the sample mean


def test_bic_prefers_one_phase_for_geometric_data():
    x = np.random.default_rng(5).geometric(0.2, size=5000)
    d = fit(x)
    assert d.phases == 1
    assert 1 - d.T[0][0] == pytest.approx(fit_geometric(x).exit[0]) == pytest.approx(0.2, abs=0.01)


def test_mixture_likelihood_never_below_geometric():
    x = np.random.default_rng(1).geometric(0.3, size=500)
    _, ll1 = fit_mixture(x, 1)
    _, ll2 = fit_mixture(x, 2)
    assert ll2 >= ll1 - 1e-6


@pytest.mark.parametrize("bad", [[], [0, 1], [1.5], [[1, 2]]])
def test_bad_samples(bad):
    with pytest.raises(RunLengthError):
        fit(bad)


def test_traces_round_trip_and_errors(tmp_path):
    save_traces(tmp_path / "t.json", {"slm": [1, 2, 3], "llm": [1]})
    assert load_traces(tmp_path / "t.json") == {"slm": [1, 2, 3], "llm": [1]}
    (tmp_path / "plain.json").write_text(json.dumps({"slm": [4, 5]}))
    assert load_traces(tmp_path / "plain.json") == {"slm": [4, 5]}
    (tmp_path / "bad.json").write_text(json.dumps({"slm": [0]}))
    with pytest.raises(RunLengthError, match="'slm'"):
        load_traces(tmp_path / "bad.json")
