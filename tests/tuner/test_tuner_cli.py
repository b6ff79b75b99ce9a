"""`tokenrouter profile` and `tokenrouter tune` end to end (real engine, tiny models)."""

import json

import pytest

from tokenrouter.cli import main
from tokenrouter.runtime.native import served_engine
from tokenrouter.tuner.profile import Profile


@pytest.mark.slow
def test_profile_then_tune(tiny_route, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", str(tiny_route), "--out", str(out), "--batch-sizes", "1,2,4", "--repeats", "2",
                 "--no-progress"]) == 0
    prof = Profile.load(out)
    assert set(prof.models) == {"small", "large"}
    for m in prof.models.values():
        assert m.alone.batch_sizes == (1, 2, 4) and m.co_located is not None and all(v > 0 for v in m.alone.ms)
    assert prof.machine["cpu_count"] >= 1 and prof.created
    assert main(["tune", str(tiny_route), "-n", "3", "--profile", str(out), "--out", str(tmp_path / "t")]) == 0
    doc = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert doc["searched"] == "large" and [p["batch"]["large"] for p in doc["curve"]] == [1, 2, 3]
    assert doc["best"]["throughput"] == max(p["throughput"] for p in doc["curve"]) <= doc["upper_bound"]
    assert (tmp_path / "t" / "tune.png").stat().st_size > 1000
    assert "B* =" in capsys.readouterr().out


@pytest.mark.slow
def test_tune_with_route_probs_and_runlengths(tiny_route, tmp_path):
    prof = tmp_path / "p.json"
    Profile.affine({"small": (6.0, 0.12), "large": (27.9, 0.558)}, colocation=0.5).save(prof)
    traces = tmp_path / "rl.json"
    traces.write_text(json.dumps({"small": [1, 1, 2, 30, 1, 45, 2, 1, 60, 1] * 20}))
    assert main(["tune", str(tiny_route), "-n", "4", "--profile", str(prof), "--runlengths", str(traces),
                 "--batch-sizes", "1,2,4", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "tune.json").read_text())
    assert doc["runlengths"]["small"]["mean"] == pytest.approx(14.4, rel=0.02)
    assert main(["tune", str(tiny_route), "-n", "4", "--profile", str(prof), "--route-prob", "0.1,1",
                 "--batch-sizes", "2", "--method", "simulation", "--out", str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s" / "tune.json").read_text())["curve"][0]["method"] == "simulation"


@pytest.mark.parametrize("extra,message", [
    (["--route-prob", "0.1"], "needs 2 numbers"),
    (["--route-prob", "a,b"], "comma-separated"),
    (["--profile", "nope.json"], "cannot read profile"),
    (["-n", "0"], "concurrency"),
    (["--batch-sizes", "0"], ">= 1"),
])
def test_tune_bad_input_is_a_message_not_a_traceback(tiny_route, tmp_path, capsys, extra, message):
    prof = tmp_path / "p.json"
    Profile.affine({"small": (6.0, 0.12), "large": (27.9, 0.558)}).save(prof)
    args = ["tune", str(tiny_route), "-n", "2", "--profile", str(prof), "--out", str(tmp_path / "o")]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tune_profile_without_the_models(tiny_route, tmp_path, capsys):
    prof = tmp_path / "p.json"
    Profile.affine({"a": (6.0, 0.12)}).save(prof)
    assert main(["tune", str(tiny_route), "-n", "2", "--profile", str(prof)]) == 2
    assert "no model 'small'" in capsys.readouterr().err


def test_profile_bad_batch_sizes(tiny_route, capsys):
    assert main(["profile", str(tiny_route), "--batch-sizes", "x"]) == 2
    assert "comma-separated" in capsys.readouterr().err


@pytest.mark.slow
def test_the_profile_times_each_model_in_its_weight_format(tiny_route, tmp_path):
    """A model served as `quant = int8` is profiled as int8, not as the float checkpoint (the
    bound and the tuner's B_i come from these steps)."""
    text = tiny_route.read_text()
    small_path = text.split('model small = "')[1].split('"')[0]
    engine, _ = served_engine(small_path, "float32", 1, 64, "int8")
    assert engine.quant == "int8" and engine.model.linears()
    assert served_engine(small_path, "float32", 1, 64)[0].quant == "none"
    route = tmp_path / "q.route"
    route.write_text(text.replace(f'model small = "{small_path}"', f'model small = "{small_path}" {{ quant = int8 }}'))
    out = tmp_path / "p.json"
    assert main(["profile", str(route), "--out", str(out), "--batch-sizes", "1,2", "--repeats", "1",
                 "--no-progress"]) == 0
    assert Profile.load(str(out)).models["small"].alone(1) > 0
