"""Subservers that die, stop or hang, against real processes over HTTP.

kill -9 under load: requests in flight survive it (see also test_recovery.py); the death is
noticed in under a second (the OS says so); while it is down /health and /metrics say which
one, and new requests get 503 with `Retry-After`; a local subserver is restarted and serving
resumes with the reference's greedy tokens; when restarts are exhausted what is in flight
ends with 503 naming the cause; two subservers' deaths are two log lines. A subserver
stopped (SIGSTOP) for less than the stall window is not restarted and its requests complete;
stopped past it, it is replaced within the bound and nothing is lost. A decoding loop that
computes for longer than the window (a long step) is busy, not stuck; one blocked for longer
is stuck and replaced. A remote one (over CURVE-authenticated tcp on loopback) is noticed by
its missing heartbeats, and its requests finish when a new process of it reports ready."""

import io
import logging
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.liveness import (can_make_netns, check_against_reference, kill_under_load, load_reference,
                                    signal_under_load)
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, ServerThread, metrics, served
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.frontend.liveness import PERIOD_S
from tokenrouter.runtime.logs import LineFormatter, RepeatFilter
from tokenrouter.runtime.subserver.links import HEARTBEAT_S

WINDOW = 6.0  # the stall window of these tests (the default, 30 s, would make them slow)
BOUND = WINDOW + PERIOD_S + HEARTBEAT_S + 1.0  # the documented bound, with a second for a loaded test host


def _wait_health(url, ok: bool, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(url + "/health", timeout=5)
        if (r.status_code == 200) == ok:
            return r
        time.sleep(0.1)
    raise AssertionError(f"/health did not turn {'ok' if ok else 'unavailable'} within {timeout} s: {r.text}")


@pytest.mark.slow
def test_kill_9_of_a_local_subserver_then_automatic_recovery_then_restarts_exhausted(pair):
    program = tiny.coin(pair, 0.3)
    fatal = []
    srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=240, concurrency=8),
                       liveness={"max_restarts": 3, "on_fatal": fatal.append})
    try:
        check_against_reference(srv.url, program, srv.tokenizer, ["before 1", "before 2"])
        old = srv.launcher.pids()["llm"]
        outage = {}

        def during():  # while it is down: /health and /metrics say so, new requests get 503 + Retry-After
            down = _wait_health(srv.url, ok=False, timeout=5)
            assert down.json()["subservers"]["llm"]["up"] is False and down.headers.get("retry-after")
            assert "llm" in down.json()["error"]["message"]
            m = metrics(srv.url)  # monitoring keeps working while it is down
            assert m["tokenrouter_subserver_up", (("model", "slm"),)] == 1
            new = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10)
            outage["new"] = (new.status_code, new.headers.get("retry-after"), new.json()["error"]["message"])

        t_dead = time.monotonic()
        results = kill_under_load(srv.url, old, then=during)
        assert [r[:2] for r in results] == [(200, None)] * 4, results  # the requests in flight survived
        status, retry, message = outage["new"]
        assert status == 503 and retry and "llm" in message
        _wait_health(srv.url, ok=True, timeout=30)
        assert time.monotonic() - t_dead < 30
        assert srv.launcher.pids()["llm"] != old
        m = metrics(srv.url)
        assert m["tokenrouter_subserver_restarts_total", (("model", "llm"),)] == 1
        assert m["tokenrouter_subserver_up", (("model", "llm"),)] == 1
        check_against_reference(srv.url, program, srv.tokenizer, ["after 1", "after 2", "before 1"])
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}

        # no restarts left: the runtime gives up and says so (serve then exits non-zero); what is
        # in flight ends with 503 naming the cause, not 500
        srv.fe.watch.max_restarts = 0
        srv.fe.watch.live["slm"].failures = 0
        results = kill_under_load(srv.url, srv.launcher.pids()["slm"])
        assert fatal and "giving up" in fatal[0]
        for status, err, *_ in results:
            assert err is not None and '"unavailable"' in err and "giving up" in err, err
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10)
        assert r.status_code == 503 and r.headers.get("retry-after") and "giving up" in r.text
        r = httpx.get(srv.url + "/health", timeout=5)
        assert r.status_code == 503 and "giving up" in r.json()["error"]["message"]
        assert metrics(srv.url)["tokenrouter_subserver_up", (("model", "slm"),)] == 0
    finally:
        srv.close()


def _restarts(srv, writer):
    return metrics(srv.url)["tokenrouter_subserver_restarts_total", (("model", writer),)]


@pytest.fixture(scope="module")
def coin(pair):
    return tiny.coin(pair, 0.3)


@pytest.fixture()
def held(coin):
    """A server whose subservers take test hooks, with a stall window of `WINDOW`."""
    with served(coin, LaunchOptions(mode="process", num_blocks=400, concurrency=8, test_hooks=True),
                liveness={"stall_window_s": WINDOW, "max_restarts": 3}) as srv:
        yield srv


@pytest.mark.slow
def test_kill_9_is_noticed_in_under_a_second_and_two_deaths_are_two_log_lines(held):
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)  # what `tokenrouter serve` writes: one filter against floods
    handler.setFormatter(LineFormatter("tokenrouter"))
    handler.addFilter(RepeatFilter())
    logging.getLogger().addHandler(handler)
    try:
        for writer in ("slm", "llm"):
            pid = held.launcher.pids()[writer]
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            deadline = t_kill + 10
            while held.fe.watch.live[writer].down_at < t_kill and time.monotonic() < deadline:
                time.sleep(0.01)
            noticed = held.fe.watch.live[writer].down_at - t_kill
            print(f"\nkill -9 of {writer} noticed after {noticed:.3f} s")
            assert 0 <= noticed < 1.0, noticed
            assert "its process exited" in held.fe.watch.live[writer].reason or held.fe.watch.live[writer].up
            _wait_health(held.url, ok=True, timeout=60)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = buf.getvalue().splitlines()
    down = [line for line in lines if " is down (" in line and "recovering its requests" in line]
    assert [line.split()[3] for line in down] == ["slm", "llm"], lines  # within a minute, yet not folded
    assert not any("more like this" in line for line in down), down
    check_against_reference(held.url, held.program, held.tokenizer, ["after two deaths"])


@pytest.mark.slow
def test_a_subserver_stopped_shorter_than_the_stall_window_is_not_restarted(held):
    want = load_reference(held.program, held.tokenizer, 4)
    pid = held.launcher.pids()["llm"]

    def pause():  # stopped for half the window, under load, then resumed
        time.sleep(WINDOW / 2)
        os.kill(pid, signal.SIGCONT)

    results = signal_under_load(held.url, pid, signal.SIGSTOP, then=pause)
    assert [r[:2] for r in results] == [(200, None)] * 4, results
    assert {tuple(r[3]) for r in results} == want  # every request completed, with the reference's tokens
    assert held.launcher.pids()["llm"] == pid and _restarts(held, "llm") == 0 and held.fe.watch.all_up
    gap = held.fe.watch.gaps()["llm"]["progress"]
    assert WINDOW / 2 - 1.0 < gap < WINDOW, gap  # it was seen standing still, for less than the window


@pytest.mark.slow
def test_a_subserver_stopped_past_the_stall_window_is_replaced_within_the_bound_losing_nothing(held):
    want = load_reference(held.program, held.tokenizer, 4)
    pid = held.launcher.pids()["llm"]
    timing = {}

    def wait_for_the_verdict():
        t_stop = time.monotonic()
        while held.fe.watch.live["llm"].up and time.monotonic() - t_stop < 3 * WINDOW:
            time.sleep(0.02)
        timing["noticed"] = held.fe.watch.live["llm"].down_at - t_stop
        timing["reason"] = held.fe.watch.live["llm"].reason

    results = signal_under_load(held.url, pid, signal.SIGSTOP, then=wait_for_the_verdict)
    print(f"\nstopped past the window of {WINDOW} s: declared down after {timing['noticed']:.2f} s")
    assert WINDOW - 1.0 < timing["noticed"] < BOUND, timing
    assert "silent for" in timing["reason"] and "stopped or hung" in timing["reason"], timing
    assert [r[:2] for r in results] == [(200, None)] * 4, results  # nothing lost
    assert {tuple(r[3]) for r in results} == want
    assert held.launcher.pids()["llm"] != pid and _restarts(held, "llm") == 1
    with pytest.raises(ProcessLookupError):  # the stopped process was killed, not left behind
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
    assert held.wait_blocks_free() == {"slm": 0, "llm": 0}


@pytest.mark.slow
def test_a_long_step_is_busy_and_a_blocked_decoding_loop_is_stuck(held):
    """The decoding loop held twice the window: computing (CPU time moves, heartbeats keep
    coming from their own thread) it is left alone; blocked (no CPU, no turns) it is replaced."""
    pids = held.launcher.pids()
    held.call(held.fe.debug_hold("slm", 2 * WINDOW, busy=True))  # the start writer: every request waits
    t0 = time.monotonic()
    r = httpx.post(held.url + "/v1/completions", json={"prompt": "through a long step", "max_tokens": 12,
                                                       "temperature": 0, "seed": 0}, timeout=120)
    assert r.status_code == 200 and time.monotonic() - t0 > WINDOW  # it waited for the step, and was served
    assert held.launcher.pids()["slm"] == pids["slm"] and _restarts(held, "slm") == 0
    assert held.fe.watch.gaps()["slm"]["heartbeat"] < WINDOW / 2  # heartbeats were never starved
    pid = pids["llm"]

    held.call(held.fe.debug_hold("llm", 10 * WINDOW, busy=False))
    t_hold = time.monotonic()
    while held.fe.watch.live["llm"].up and time.monotonic() - t_hold < 3 * WINDOW:
        time.sleep(0.02)
    lv = held.fe.watch.live["llm"]
    assert not lv.up and "stuck" in lv.reason and lv.down_at - t_hold < BOUND, (lv.reason, lv.down_at - t_hold)
    _wait_health(held.url, ok=True, timeout=60)
    assert held.launcher.pids()["llm"] != pid and _restarts(held, "llm") == 1
    check_against_reference(held.url, held.program, held.tokenizer, ["after a hang"])


@pytest.mark.skipif("can_make_netns()", reason="test_netns.py runs this across a real network namespace")
def test_kill_9_of_a_remote_subserver_over_curve_tcp(pair, tmp_path):
    from tokenrouter.runtime.transport.security import generate_keys
    keys = str(tmp_path / "keys")
    generate_keys(keys)
    program = tiny.example_program("demo", str(tmp_path), pair)
    binds = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("frontend", "slm", "llm")}
    cmd = [*CLI, "serve", str(tmp_path / "demo.route"), "--subserver", "llm",
           "--model", f"slm={pair['slm']}", "--model", f"llm={pair['llm']}", "--num-blocks", "240",
           "--curve-keys", keys] + [a for n, addr in binds.items() for a in ("--bind", f"{n}={addr}")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
    srv = None
    try:
        srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=240, addresses=binds,
                                                  remote=("llm",), curve_keys=keys),
                           liveness={"heartbeat_timeout_s": 3.0})
        check_against_reference(srv.url, program, srv.tokenizer, ["remote one", "remote two"])

        def restart_remote():  # noticed by its silence; its host's supervisor starts a new one
            r = _wait_health(srv.url, ok=False, timeout=10)
            assert "no heartbeat" in r.json()["subservers"]["llm"]["reason"]
            new = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10)
            assert new.status_code == 503 and "llm" in new.json()["error"]["message"]
            assert metrics(srv.url)["tokenrouter_subserver_up", (("model", "llm"),)] == 0
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))

        results = kill_under_load(srv.url, procs[0].pid, then=restart_remote)
        assert [r[:2] for r in results] == [(200, None)] * 4, results  # they waited for it, and finished
        check_against_reference(srv.url, program, srv.tokenizer, ["remote three"])
    finally:
        if srv is not None:
            srv.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
