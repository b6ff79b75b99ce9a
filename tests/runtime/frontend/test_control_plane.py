"""The control plane against a local stranger, over real sockets and real subserver processes.

On tcp (loopback, keys made by the launch): a stranger's forged `ready`, heartbeats,
`shutdown`, `announce` + `configure` and `submit` never get through the handshake; they are
counted, no work runs, and /v1/models is unchanged. Over ipc (the same user, who can reach
the sockets): a second `ready` cannot reconfigure anything, forged heartbeats cannot keep a
stopped subserver up, and messages without the live incarnation are dropped. A storm of
frames nested past the parser's guard, to every socket, declares nothing down and leaves
legitimate requests their latency."""

import json
import os
import signal
import statistics
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import zmq

from tests.helpers import tiny
from tests.helpers.liveness import check_against_reference
from tests.helpers.ports import free_port
from tests.helpers.serving import metrics, served
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.transport import wire

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

NESTED = b"[" * 50_000 + b"]" * 50_000  # 100 KB


def _dropped(url, model, reason):
    return metrics(url).get(("tokenrouter_frames_dropped_total", (("model", model), ("reason", reason))), 0)


def _wait(cond, timeout=15.0, what=""):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class _Stranger:
    """A process that can reach the sockets: a zmq context and the PUSH sockets it opens,
    closed together."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.socks: dict = {}

    def push(self, addresses: dict[str, str]) -> dict:
        """A plain PUSH socket to every endpoint (what a process that can reach them can open)."""
        for name, addr in addresses.items():
            self.socks[name] = self.ctx.socket(zmq.PUSH)
            self.socks[name].setsockopt(zmq.SNDHWM, 0)
            self.socks[name].connect(addr)
        return self.socks

    def close(self):
        for s in self.socks.values():
            s.close(0)
        self.ctx.term()


@contextmanager
def _served_with_a_stranger(program, opts: LaunchOptions, liveness: dict | None = None):
    """(the server, a `_Stranger`) for the test's body; both are closed when it ends."""
    with served(program, opts, liveness=liveness) as srv:
        stranger = _Stranger()
        try:
            yield srv, stranger
        finally:
            stranger.close()


def _forged_ready(old_format: bool) -> bytes:
    """A ready that would shrink the context to 3 tokens: today's wire format and this one's."""
    m = {"v": 1, "t": "ready", "writer": "slm", "pid": 1, "block_size": 16, "blocks_total": 8, "max_model_len": 3,
         "vocab_size": 259, "threads": 1, "batch_threshold": 1, "max_wait_ms": 20.0}
    if not old_format:
        m["inc"] = 12345
    return json.dumps(m).encode()


@pytest.fixture(scope="module")
def program(pair):
    return tiny.coin(pair, 0.3)


def test_a_local_stranger_on_tcp_is_refused_and_counted_and_changes_nothing(program):
    binds = {n: f"tcp://127.0.0.1:{free_port()}" for n in ("frontend", "slm", "llm")}
    opts = LaunchOptions(mode="process", num_blocks=240, addresses=binds)
    with _served_with_a_stranger(program, opts) as (srv, stranger):
        models = httpx.get(srv.url + "/v1/models", timeout=10).json()
        pids = srv.launcher.pids()
        socks = stranger.push(binds)
        s = socks["frontend"]
        s.send(_forged_ready(True))
        s.send(_forged_ready(False))
        for _ in range(5):
            s.send(json.dumps({"v": 1, "t": "heartbeat", "writer": "llm", "pid": pids["llm"]}).encode())
        socks["llm"].send(json.dumps({"v": 1, "t": "shutdown"}).encode())
        socks["llm"].send(wire.encode(wire.Shutdown(to=1)))
        for frame in ({"v": 1, "t": "announce", "rid": "ghost"}, {"v": 1, "t": "configure", "batch_threshold": 64},
                      {"v": 1, "t": "submit", "rid": "work", "prompt": [5, 6, 7], "sampling": {"max_tokens": 59}}):
            socks["slm"].send(json.dumps(frame).encode())
        for name, model in (("frontend", "frontend"), ("slm", "slm"), ("llm", "llm")):
            _wait(lambda: _dropped(srv.url, model, "unauthenticated") >= 1, what=f"{name} to count the stranger")
        assert httpx.get(srv.url + "/v1/models", timeout=10).json() == models  # max_model_len unchanged
        m = metrics(srv.url)
        assert m["tokenrouter_batch_threshold", (("model", "slm"),)] == 1.0
        assert m["tokenrouter_kv_blocks_used", (("model", "slm"),)] == 0 and m["tokenrouter_steps_total", (("model", "slm"),)] == 0
        assert srv.launcher.alive() == {"slm": True, "llm": True} and srv.launcher.pids() == pids
        check_against_reference(srv.url, program, srv.tokenizer, ["after the stranger"])
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}


def test_same_user_forgeries_over_ipc_are_dropped_by_state_and_incarnation(program):
    opts = LaunchOptions(mode="process", num_blocks=240)
    with _served_with_a_stranger(program, opts, liveness={"stall_window_s": 2.0}) as (srv, stranger):
        socks = stranger.push(srv.launcher.addresses)
        models = httpx.get(srv.url + "/v1/models", timeout=10).json()
        # a second ready cannot reconfigure anything
        socks["frontend"].send(_forged_ready(False))
        _wait(lambda: _dropped(srv.url, "frontend", "unexpected") >= 1, what="the ready to be refused")
        assert httpx.get(srv.url + "/v1/models", timeout=10).json() == models
        # without the live incarnation, shutdown, announce and configure are dropped
        socks["llm"].send(wire.encode(wire.Shutdown(to=1)))
        socks["slm"].send(wire.encode(wire.Announce(to=1, rid="ghost")))
        socks["slm"].send(wire.encode(wire.Configure(to=1, batch_threshold=64)))
        _wait(lambda: _dropped(srv.url, "slm", "stale") >= 2 and _dropped(srv.url, "llm", "stale") >= 1,
              what="the subservers to drop them")
        assert metrics(srv.url)["tokenrouter_batch_threshold", (("model", "slm"),)] == 1.0
        assert srv.launcher.alive() == {"slm": True, "llm": True}
        # forged heartbeats do not keep a stopped subserver up
        pid = srv.launcher.pids()["llm"]
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            while (health := httpx.get(srv.url + "/health", timeout=5)).status_code == 200:
                socks["frontend"].send(wire.encode(wire.Heartbeat(writer="llm", pid=pid, inc=99)))
                assert time.monotonic() - stopped < 10, "a stopped subserver stayed up"
                time.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "stopped or hung" in health.text
        assert _dropped(srv.url, "frontend", "stale") >= 1
        _wait(lambda: httpx.get(srv.url + "/health", timeout=5).status_code == 200, 60, "the restart")
        assert srv.launcher.pids()["llm"] != pid
        check_against_reference(srv.url, program, srv.tokenizer, ["after the forgeries"])


def _latencies(url, n, tag):
    out = []
    for i in range(n):
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": f"{tag} {i}", "max_tokens": 8, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        out.append(time.monotonic() - t0)
    return out


def test_a_storm_of_deeply_nested_frames_to_every_socket_declares_nothing_down(program):
    opts = LaunchOptions(mode="process", num_blocks=240)
    with _served_with_a_stranger(program, opts, liveness={"stall_window_s": 3.0}) as (srv, stranger):
        socks = stranger.push(srv.launcher.addresses)
        before = _latencies(srv.url, 8, "before")
        socks["frontend"].send(NESTED)  # the frame that used to kill the frontend's receive loop
        _wait(lambda: _dropped(srv.url, "frontend", "invalid") >= 1, what="the frame to be dropped")

        def storm():
            for _ in range(1000):
                for s in socks.values():
                    s.send(NESTED)

        t = threading.Thread(target=storm)
        t.start()
        during = _latencies(srv.url, 8, "during")
        t.join()
        _wait(lambda: all(_dropped(srv.url, m, "invalid") >= 1000 for m in ("slm", "llm"))
              and _dropped(srv.url, "frontend", "invalid") >= 1001, 60, "every frame to be dropped")
        after = _latencies(srv.url, 4, "after")
        print(f"\nlatency (s) before / during / after the storm: {statistics.median(before):.3f} / "
              f"{statistics.median(during):.3f} / {statistics.median(after):.3f}")
        m = metrics(srv.url)
        assert all(m["tokenrouter_subserver_restarts_total", (("model", w),)] == 0 for w in ("slm", "llm"))
        assert srv.fe.watch.all_up and srv.fe.endpoint.loop_restarts == 0
        assert statistics.median(during) < 3 * statistics.median(before) + 1.0
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
