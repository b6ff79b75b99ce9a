import json

import pytest

from tokenrouter.tuner.profile import Curve, Profile, ProfileError


def test_curve_interpolates_and_extends_the_affine_line():
    c = Curve((1, 2, 4), (10.0, 12.0, 16.0))  # exactly 8 + 2b
    assert c(1) == 10.0 and c(3) == pytest.approx(14.0)
    assert c(8) == pytest.approx(8 + 2 * 8)  # beyond: the least-squares line's slope
    with pytest.raises(ProfileError, match="profile larger batches"):
        c(17)


def test_curve_never_gets_faster_with_a_bigger_batch():
    c = Curve((1, 2, 4), (10.0, 9.0, 12.0))  # noise: b=2 measured faster than b=1
    assert c(2) == 10.0


@pytest.mark.parametrize("bad", [((1, 1), (1.0, 2.0)), ((2, 1), (1.0, 2.0)), ((1,), (-1.0,)), ((1, 2), (1.0,))])
def test_curve_rejects_bad_points(bad):
    with pytest.raises(ProfileError):
        Curve(*bad)


def test_json_round_trip(tmp_path):
    p = Profile.affine({"a": (5.0, 0.5), "b": (20.0, 1.0)}, colocation={"a": 0.5, "b": 1.0})
    p.save(tmp_path / "p.json")
    q = Profile.load(tmp_path / "p.json")
    assert q.step_ms("a", 3, False) == pytest.approx(6.0)
    assert q.step_ms("b", 3, True) == pytest.approx(2 * 22.0)
    assert q["a"].slowdown(2) == pytest.approx(1.5)


def test_profile_errors_are_clear(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        Profile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(ProfileError, match="not valid JSON"):
        Profile.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"format": "tokenrouter-profile", "version": 99}))
    with pytest.raises(ProfileError, match="version"):
        Profile.load(tmp_path / "y.json")
    good = Profile.affine({"a": (5.0, 0.5)}).to_dict()
    good["models"]["a"]["decode"]["alone_ms"] = [1.0]
    with pytest.raises(ProfileError, match="model 'a'"):
        Profile.from_dict(good)
    with pytest.raises(ProfileError, match="no model 'zz'"):
        Profile.affine({"a": (5.0, 0.5)})["zz"]
