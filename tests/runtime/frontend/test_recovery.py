"""Requests survive a subserver's death: kill -9 of either subserver under 16 concurrent
greedy requests, three times each, against real processes over HTTP. None of the 16 fails,
every output equals the single-request reference, the restarted subserver re-prefills what
it lost (counted in /metrics), and every KV block comes back."""

import os
import signal
import threading
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.liveness import stream_tokens
from tests.helpers.serving import ServerThread, metrics
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.reference import Reference

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

N = 16
MAX_TOKENS = 120
PROMPTS = [f"survive {i}: " + "abc" * (i % 5) for i in range(N)]


def _one(url, prompt, stream, started, results):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 0, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=120) as c:
        if not stream:
            started.release()
            r = c.post("/v1/completions", json=body)
            results[prompt] = (r.status_code, r.json()["choices"][0]["token_ids"] if r.status_code == 200 else r.text)
            return
        status, err, ids = stream_tokens(c, body, started)
        results[prompt] = (status if err is None else 500, ids if err is None else err)


def _kill_under_load(srv, writer):
    """Kill `writer` while N requests run; (results, seconds from the kill until /health is ok)."""
    results, started = {}, threading.Semaphore(0)
    ts = [threading.Thread(target=_one, args=(srv.url, p, i % 2 == 0, started, results)) for i, p in enumerate(PROMPTS)]
    for t in ts:
        t.start()
    for _ in ts:
        assert started.acquire(timeout=60)
    time.sleep(0.3)  # tokens are flowing for every request
    pid = srv.launcher.pids()[writer]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    back = None
    while time.monotonic() - killed < 60:
        r = httpx.get(srv.url + "/health", timeout=5)
        if r.status_code == 200 and r.json()["subservers"][writer]["pid"] != pid:
            back = time.monotonic() - killed
            break
        # down (or its death not noticed yet): /health says ok only when a request can complete
        assert r.status_code == 503 or r.json()["subservers"][writer]["pid"] == pid, r.text
        time.sleep(0.05)
    for t in ts:
        t.join(120)
    return results, back


@pytest.fixture(scope="module")
def program(pair):
    return tiny.coin(pair, 0.3)


def test_kill_9_of_either_subserver_under_16_greedy_requests_loses_none(program):
    srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=400, concurrency=N),
                       liveness={"max_restarts": 5})
    try:
        ref = Reference(program)
        want = {p: ref.generate(srv.tokenizer.encode(p), SamplingParams(max_tokens=MAX_TOKENS)).tokens
                for p in PROMPTS}
        recovered = {}
        for writer in ("slm", "llm") * 3:
            results, back = _kill_under_load(srv, writer)
            assert back is not None, f"{writer} did not come back"
            recovered.setdefault(writer, []).append(round(back, 2))
            bad = {p: r for p, r in results.items() if r[0] != 200}
            assert not bad and len(results) == N, bad
            for p in PROMPTS:
                assert results[p][1] == want[p], p
        print(f"\nrecovered after kill -9 (s): {recovered}")
        m = metrics(srv.url)
        assert m["tokenrouter_subserver_restarts_total", (("model", "llm"),)] == 3
        assert m["tokenrouter_subserver_restarts_total", (("model", "slm"),)] == 3
        resumed = sum(v for k, v in m.items() if k[0] == "tokenrouter_requests_resumed_total")
        reprefills = sum(v for k, v in m.items() if k[0] == "tokenrouter_reprefills_total")
        assert resumed > 0 and reprefills > 0, (resumed, reprefills)
        assert m.get(("tokenrouter_requests_total", (("reason", "error"),)), 0) == 0
        assert srv.wait_blocks_free() == {"slm": 0, "llm": 0}
    finally:
        srv.close()
