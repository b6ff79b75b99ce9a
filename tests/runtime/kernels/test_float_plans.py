"""A float32 model's matrices run the kernels measured fastest on the host per row count.

The choice is a measurement, never a constant: these tests check the rule that turns
timings into a plan, that a measured plan runs and is cached, that processes starting
together measure once, and that tiny matrices (whose timings are noise) run one fixed kernel
in every process."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch

from tests.helpers.tiny import write_model
from tokenrouter.runtime.kernels import plan as kernels
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.kernels.linear import PlannedLinear
from tokenrouter.runtime.kernels.plan import choose, per_rows_plan
from tokenrouter.runtime.loader import load_model


def test_the_plan_takes_the_fastest_kernel_per_row_count_and_merges_neighbours():
    t = {"onednn": {1: 5.0, 2: 5.0, 4: 2.0, 8: 3.0, 16: 4.0},
         "linear": {1: 2.0, 2: 2.1, 4: 4.0, 8: 6.0, 16: 9.0},
         "mkl": {1: 3.0, 2: 2.0, 4: 5.0, 8: 7.0, 16: 9.5}}
    assert per_rows_plan(t, (1, 2, 4, 8, 16)) == [(1, "linear"), (2, "mkl"), (16, "onednn")]


def test_a_plain_kernel_within_the_margin_beats_onednn_which_would_cost_a_copy():
    t = {"onednn": {1: 1.00, 2: 1.0}, "linear": {1: 1.05, 2: 1.2}, "mkl": {1: 1.3, 2: 1.3}}
    assert per_rows_plan(t, (1, 2)) == [(1, "linear"), (2, "onednn")]


def test_rows_past_the_plan_run_its_last_kernel():
    lin = PlannedLinear(torch.randn(32, 16), torch.float32)
    lin.finalize([(2, "linear"), (8, "mkl")])
    assert [lin.kernel_for(r) for r in (1, 2, 3, 8, 9, 500)] == ["linear", "linear", "mkl", "mkl", "mkl", "mkl"]


def test_plain_kernels_share_one_copy_and_onednn_adds_its_own():
    w = torch.randn(64, 32)
    plain = PlannedLinear(w, torch.float32)
    plain.finalize([(2, "linear"), (64, "mkl")])
    assert plain.impl["linear"] is plain.impl["mkl"] and plain.nbytes() == w.numel() * 4
    if "onednn" in plain.candidates():
        both = PlannedLinear(w, torch.float32)
        both.finalize([(2, "linear"), (64, "onednn")])
        assert set(both.impl) == {"linear", "onednn"}


def _model(tmp_path, hidden=64):
    folder = str(tmp_path / "m")
    write_model(folder, layers=2, hidden=hidden, seed=3)
    return load_model(folder)


def _engine(m, **kw):
    return Engine(m.config, m.weights, EngineOptions(block_size=4, num_blocks=64, max_model_len=128, **kw))


def test_tiny_matrices_run_f_linear_unmeasured(tmp_path, tmp_cache):
    m = _model(tmp_path)
    plan_cache = m.engine_options().plan_cache
    eng = _engine(m, plan_cache=plan_cache)
    assert eng.kernel_plans and all(plan == [(64, "linear")] for plan in eng.kernel_plans.values())
    with open(plan_cache) as f:
        assert json.load(f)["timings_ms"] == {}  # nothing was timed


def test_a_measured_float_plan_is_cached_runs_and_matches_a_single_kernel(tmp_path, tmp_cache, monkeypatch):
    monkeypatch.setattr(kernels, "MEASURE_MIN_BYTES", 0)
    m = _model(tmp_path)
    plan_cache = m.engine_options().plan_cache
    measured = _engine(m, plan_cache=plan_cache)
    assert os.path.exists(plan_cache)
    for key, plan in measured.kernel_plans.items():
        rows = [r for r, _ in plan]
        assert rows == sorted(rows) and rows[-1] == kernels.ROW_BUCKETS[-1], plan
        assert {k for _, k in plan} <= {"linear", "mkl", "onednn"}
    again = _engine(m, plan_cache=plan_cache)
    assert again.kernel_plans == measured.kernel_plans  # read back, not measured again
    # whatever kernels the plan mixes, each computes x @ W.T: a batch of every size agrees
    # with one kernel throughout to float32 rounding
    ref = _engine(m, kernel_plan="linear")
    for n in (1, 3, 9, 20):
        batch = [(i, [5 + i, 9, 13 + i]) for i in range(n)]
        got, want = measured.step(batch).logits, ref.step(batch).logits
        assert (got - want).abs().max() < 1e-4
        for i in range(n):
            measured.free(i), ref.free(i)


def _choose_in_a_process(path, barrier, out):
    kernels.MEASURE_MIN_BYTES = 0
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    lins = [PlannedLinear(torch.randn(128, 64, generator=g), torch.float32) for _ in range(4)]
    barrier.wait()
    calls = []
    real = kernels.measure

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    kernels.measure = counting
    plans = choose(lins, None, path, per_rows=True)
    out.put((len(calls), plans))


@pytest.mark.slow
def test_processes_starting_together_measure_once_and_share_the_plan(tmp_path):
    path = str(tmp_path / "plans" / "p.json")
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_choose_in_a_process, args=(path, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sorted(n for n, _ in results) == [0, 1]  # one measured, the other read its plan
    assert results[0][1] == results[1][1]


def test_float64_and_unmeasured_devices_keep_f_linear(tmp_path, tmp_cache):
    m = load_model(_model(tmp_path).folder, dtype=torch.float64)
    eng = Engine(m.config, m.weights, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=16, max_model_len=64))
    assert eng.kernel_plans == {} and eng.model.linears() == []


@pytest.mark.parametrize("plan", ["linear", "mkl", "onednn"])
def test_a_forced_float_kernel_runs_every_matrix(tmp_path, tmp_cache, plan):
    m = _model(tmp_path)
    eng = _engine(m, kernel_plan=plan)
    used = {k for p in eng.kernel_plans.values() for _, k in p}
    assert used == ({plan} if plan in eng.model.lm_head.candidates() or plan != "onednn" else {"mkl"})
