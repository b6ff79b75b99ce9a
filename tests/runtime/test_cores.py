"""The host's cores shared by need (`runtime/cores.py`): the split, the ledger between real
processes, the launch plan, and serving: an idle writer leaves the other every core."""

import multiprocessing as mp
import os
from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import tiny
from tokenrouter.runtime.cores import SPIN_ENV, CoreShare, Ledger, LedgerSpec, environment, host_cores, share
from tokenrouter.runtime.launch import LaunchOptions, plan, sharing_writers
from tokenrouter.runtime.offline import LLM, SamplingParams


@given(st.integers(1, 256), st.integers(1, 64))
def test_the_split_uses_every_core_once_and_is_as_even_as_integers_allow(cores, active):
    got = [share(cores, active, r) for r in range(active)]
    assert min(got) >= 1 and max(got) - min(got) <= 1
    assert sum(got) == max(cores, active)  # oversubscribed only where there are more writers than cores


def _hold(spec: dict, holding, release) -> None:
    """A writer that steps until `release`: its byte set, its threads what the ledger gives."""
    import torch
    share_ = CoreShare(LedgerSpec(**spec))
    with share_.stepping() as n:
        assert torch.get_num_threads() == n
        holding.set()
        release.wait(30)
    share_.close()


def test_a_writer_alone_takes_every_core_and_two_stepping_split_them():
    led = Ledger(["small", "large"], cores=6)
    seen = []
    try:
        small = CoreShare(led.spec("small"), set_threads=seen.append)
        with small.stepping() as n:
            assert n == 6  # the other holds nothing while it does not step
        ctx = mp.get_context("spawn")
        holding, release = ctx.Event(), ctx.Event()
        other = ctx.Process(target=_hold, args=(asdict(led.spec("large")), holding, release))
        other.start()
        try:
            assert holding.wait(60)
            with small.stepping() as n:
                assert n == 3  # the other process steps now: half each
        finally:
            release.set()
            other.join(30)
        assert other.exitcode == 0
        with small.stepping() as n:
            assert n == 6  # and back when it is done
        assert seen == [6, 3, 6] and small.changes == 3  # torch's count changes only when the share does
        # a restarted writer clears what a killed one left in its byte
        with open(led.path, "r+b") as f:
            f.seek(1)
            f.write(b"\x01")
        assert CoreShare(led.spec("small"), set_threads=seen.append).threads_now() == 3
        CoreShare(led.spec("large"), set_threads=lambda n: None)
        assert small.threads_now() == 6
    finally:
        led.close()
    assert not os.path.exists(led.path)


def test_the_launch_shares_the_cores_of_writers_without_fixed_threads(pair):
    p = tiny.coin(pair, 0.1)
    cores = host_cores()
    led = Ledger(sharing_writers(p, LaunchOptions()))
    try:
        specs = plan(p, LaunchOptions(mode="process"), ledger=led)
        assert {w: s.threads for w, s in specs.items()} == {"slm": cores, "llm": cores}
        assert specs["slm"].cores["slot"] != specs["llm"].cores["slot"]
        assert specs["slm"].cores["path"] == specs["llm"].cores["path"] == led.path
    finally:
        led.close()
    split = plan(p, LaunchOptions(mode="process", cores="split"))
    assert {s.threads for s in split.values()} == {max(1, cores // 2)} and all(s.cores is None for s in split.values())
    assert sharing_writers(p, LaunchOptions(threads={"llm": 1})) == ["slm"]  # fixed threads: not shared
    assert sharing_writers(tiny.coin(pair, 0.1, threads=(("slm", 2),)), LaunchOptions()) == ["llm"]
    with pytest.raises(ValueError, match="cores mode"):
        plan(p, LaunchOptions(cores="most"))


def test_the_environment_of_a_child_is_restored_and_the_users_setting_wins(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with environment(SPIN_ENV):
        assert os.environ["OMP_WAIT_POLICY"] == "passive"
    assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    with environment(SPIN_ENV):
        assert os.environ["OMP_WAIT_POLICY"] == "active"


@pytest.mark.slow
def test_an_idle_writer_leaves_the_other_every_core_and_the_tokens_do_not_change(pair):
    """Served in processes: with no handoff the large writer never steps, so every step of the
    small one launches on every core, the thread setting it has alone; with handoffs, steps
    that overlap split them; the greedy tokens equal the fixed split's either way."""
    cores = host_cores()
    prompts = [[1, 2, 3, 4 + i] for i in range(6)]
    params = SamplingParams(max_tokens=12, temperature=0.0)

    def run(p_handoff: float, mode: str):
        with LLM(tiny.coin(pair, p_handoff), launch=LaunchOptions(mode="process", cores=mode, num_blocks=128)) as llm:
            outs = llm.generate(prompts, params, concurrency=6, use_tqdm=False, ignore_eos=True)
            return [o.token_ids for o in outs], llm.stats()

    toks, stats = run(0.0, "share")
    assert stats["llm"]["steps"] == 0
    assert stats["slm"]["step_threads"] == {str(cores): stats["slm"]["steps"]} and stats["slm"]["steps"] > 0
    assert toks == run(0.0, "split")[0]
    toks, stats = run(0.3, "share")
    assert stats["llm"]["steps"] > 0
    for w in ("slm", "llm"):  # every step on the whole host or on a share of it, never more
        assert set(stats[w]["step_threads"]) <= {str(cores), str(share(cores, 2, 0)), str(share(cores, 2, 1))}
    assert toks == run(0.3, "split")[0]
