"""Steps that catch a returning request up are extends, and the tuner times them so.

A request that comes back to a model feeds everything the other model wrote meanwhile
(about its run length) in one step; `ModelProfile.step_ms(tokens=...)` reads the
profile's extend curves and `System.two_models` works out the mean tokens per step.
"""

import dataclasses

import pytest

from tokenrouter.tuner import dtmc
from tokenrouter.tuner.profile import Curve, ModelProfile, Profile, ProfileError
from tokenrouter.tuner.simulate import simulate
from tokenrouter.tuner.system import System


def model(extend=True, co=None):
    ext = {4: Curve((1, 2), (16.0, 20.0)), 16: Curve((1, 2), (40.0, 50.0))} if extend else {}
    return ModelProfile("m", Curve((1, 2), (10.0, 12.0)), co, ext)


def test_extend_curves_are_interpolated_in_tokens():
    m = model()
    assert m.step_ms(1, tokens=1) == pytest.approx(10.0)  # a decode
    assert m.step_ms(1, tokens=4) == pytest.approx(16.0)
    assert m.step_ms(1, tokens=10) == pytest.approx(16.0 + (40.0 - 16.0) * 6 / 12)
    assert m.step_ms(2, tokens=2.5) == pytest.approx(12.0 + (20.0 - 12.0) * 1.5 / 3)
    assert m.step_ms(1, tokens=20) == pytest.approx(40.0 + (40.0 - 16.0) / 12 * 4)  # linear beyond
    with pytest.raises(ProfileError, match="--extend"):
        m.step_ms(1, tokens=100)


def test_without_extend_curves_every_step_is_a_decode():
    assert model(extend=False).step_ms(2, tokens=10) == pytest.approx(12.0)


def test_colocation_scales_extends_by_the_decode_slowdown():
    m = model(co=Curve((1, 2), (15.0, 18.0)))
    assert m.step_ms(1, co_located=True, tokens=4) == pytest.approx(16.0 * 1.5)


def test_tokens_per_step_of_a_pair():
    prof = Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)})
    s = System.two_models(prof, "slm", "llm", 4, 0.05, 1.0)  # R2R-like: one-token large visits
    assert s.tokens_per_step["llm"] == pytest.approx(20.0)  # catches up on the small model's run
    assert s.tokens_per_step["slm"] == pytest.approx(1.0)
    s = System.two_models(prof, "slm", "llm", 4, 0.05, 0.5)  # large visits of 2 steps on average
    assert s.tokens_per_step["llm"] == pytest.approx((20 + 2 - 1) / 2)
    assert s.tokens_per_step["slm"] == pytest.approx((2 + 20 - 1) / 20)


def _with_extends(prof: Profile, name: str, per_token_ms: float) -> Profile:
    m = prof[name]
    ext = {k: Curve(m.alone.batch_sizes, tuple(v + per_token_ms * (k - 1) for v in m.alone.ms)) for k in (4, 16)}
    return dataclasses.replace(prof, models={**prof.models, name: dataclasses.replace(m, extend=ext)})


def test_one_request_closed_form_with_extend_steps():
    prof = _with_extends(Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}), "llm", 2.0)
    s = System.two_models(prof, "slm", "llm", 1, 0.1, 0.5)
    r_s, r_l = 10.0, 2.0
    k_l = (r_s + r_l - 1) / r_l
    k_s = (r_l + r_s - 1) / r_s
    l_s = 6.0  # slm has no extend curves: its steps are timed as decodes
    l_l = 27.9 + 2.0 * (k_l - 1)
    assert k_s > 1
    expected = (r_s - 1 + r_l) / (r_s * l_s + r_l * l_l) * 1000
    assert dtmc.solve(s).throughput == pytest.approx(expected, rel=1e-9)


def test_chain_matches_the_simulator_with_extend_steps():
    prof = _with_extends(Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=0.5), "llm", 1.5)
    s = System.two_models(prof, "slm", "llm", 4, 0.1, 1.0, batch={"llm": 2})
    chain = dtmc.solve(s)
    sim = simulate(s, tokens=150_000, seed=11)
    assert abs(chain.throughput / sim.throughput - 1) < 0.03, (chain.throughput, sim.throughput)
    decode_only = dtmc.solve(dataclasses.replace(s, tokens_per_step={}))
    assert chain.throughput < decode_only.throughput  # catching up costs time
