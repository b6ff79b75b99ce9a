"""What each subserver is given: writers served, B_i, waits, threads."""

import pytest

from tests.helpers import tiny
from tokenrouter.compiler import ir
from tokenrouter.runtime.cores import host_cores
from tokenrouter.runtime.launch import LaunchOptions, batch_thresholds, plan, served_writers


def test_auto_defaults_and_schedule_values(pair):
    p = tiny.coin(pair, 0.1, batch=(("llm", "auto"),), max_wait_ms=(("llm", 7.0),))
    assert served_writers(p) == ["slm", "llm"]
    assert batch_thresholds(p, ["slm", "llm"], concurrency=8) == {"slm": 1, "llm": 4}
    assert batch_thresholds(p, ["slm", "llm"], concurrency=3) == {"slm": 1, "llm": 1}
    assert batch_thresholds(p, ["slm", "llm"], concurrency=32) == {"slm": 1, "llm": 4}
    assert batch_thresholds(p, ["slm", "llm"], 8, overrides={"llm": 2}) == {"slm": 1, "llm": 2}
    fixed = tiny.coin(pair, 0.1, batch=(("llm", 6),))
    assert batch_thresholds(fixed, ["slm", "llm"], 8)["llm"] == 6
    specs = plan(p, LaunchOptions(mode="process"))
    assert specs["llm"].max_wait_ms == 7.0 and specs["slm"].max_wait_ms == 20.0
    assert specs["slm"].threads == host_cores()  # shared by need: all of them while the other is idle
    assert plan(p, LaunchOptions(mode="process", cores="split"))["slm"].threads == max(1, host_cores() // 2)
    threaded = plan(p, LaunchOptions(mode="process", threads={"llm": 3}))
    assert threaded["llm"].threads == 3


def test_ensemble_members_share_the_ensemble_subserver(pair):
    assert served_writers(tiny.ensemble(pair)) == ["avg"]


@pytest.mark.slow
def test_auto_thresholds_from_the_tuner_when_the_program_fixes_routing(pair):
    from tokenrouter.tuner.profile import Profile
    from tokenrouter.tuner.program import auto_thresholds
    prof = Profile.affine({"slm": (6.0, 0.1), "llm": (28.0, 0.5)}, colocation=0.5)
    p = tiny.coin(pair, 0.2, batch=(("llm", "auto"),))
    b = batch_thresholds(p, ["slm", "llm"], concurrency=8, tuned=auto_thresholds(p, prof, 8, ["slm", "llm"]))
    assert b["slm"] == 1 and 1 <= b["llm"] <= 8
    # an entropy rule does not fix the routing probabilities: the default applies
    r = tiny.rstitch(pair, 0.2, batch=(("llm", "auto"),))
    assert batch_thresholds(r, ["slm", "llm"], concurrency=8,
                            tuned=auto_thresholds(r, prof, 8, ["slm", "llm"])) == {"slm": 1, "llm": 4}


def test_unreachable_writers_get_no_subserver(pair):
    p = tiny.coin(pair, 0.1)
    lone = ir.Program(source="<t>", language_version=1, models=p.models, start="slm")
    assert served_writers(lone) == ["slm"]
