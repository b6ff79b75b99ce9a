"""Subservers that die: kill -9 under load. Requests in flight survive it (see also
test_recovery.py); while it is down /health and /metrics say which one, and new requests get
503 with `Retry-After`; a local subserver is restarted and serving resumes with the
reference's greedy tokens; when restarts are exhausted what is in flight ends with 503 naming
the cause. A remote one (over CURVE-authenticated tcp on loopback) is noticed by its missing
heartbeats, and its requests finish when a new process of it reports ready."""

import subprocess
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.liveness import check_against_reference, kill_under_load
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, ServerThread, metrics
from tokenrouter.runtime.frontend.launch import LaunchOptions


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
                       liveness={"heartbeat_timeout_s": 3.0, "max_restarts": 3, "on_fatal": fatal.append})
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
        for status, err, _ in results:
            assert err is not None and '"unavailable"' in err and "giving up" in err, err
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=10)
        assert r.status_code == 503 and r.headers.get("retry-after") and "giving up" in r.text
        r = httpx.get(srv.url + "/health", timeout=5)
        assert r.status_code == 503 and "giving up" in r.json()["error"]["message"]
        assert metrics(srv.url)["tokenrouter_subserver_up", (("model", "slm"),)] == 0
    finally:
        srv.close()


def _netns_available() -> bool:
    from test_netns import can_make_netns
    return can_make_netns()


@pytest.mark.skipif("_netns_available()", reason="test_netns.py runs this across a real network namespace")
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
