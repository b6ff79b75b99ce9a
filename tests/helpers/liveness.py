"""Serving under faults: streamed load, killing a subserver under it, checking answers
against the single-request reference (the liveness and network-namespace tests)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.reference import Reference


def stream_load(url, n, results, started):
    """n long streamed requests; record (status, error text, end time) for each."""
    def one(i):
        with httpx.Client(base_url=url, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json={
                    "prompt": f"load {i}", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                    "stream": True}) as r:
                err, first = None, True
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        if first:
                            started.release()
                            first = False
                        if '"error"' in line:
                            err = line
                    if line == "data: [DONE]":
                        break
                if first:
                    started.release()
                    err = err or r.read().decode()
                results.append((r.status_code, err, time.monotonic()))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def check_against_reference(url, program, tokenizer, prompts):
    """Greedy answers over HTTP equal the reference's; `seed` 0 gives each request the
    reference's route seed (an unseeded one would get its own, from its request id)."""
    ref = Reference(program)
    for p in prompts:
        r = httpx.post(url + "/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0, "seed": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        want = ref.generate(tokenizer.encode(p), SamplingParams(max_tokens=12, stop_token_ids=tokenizer.eos_token_ids))
        assert r.json()["choices"][0]["token_ids"] == want.tokens


def kill_under_load(url, pid, n=4):
    results, started = [], threading.Semaphore(0)
    ts = stream_load(url, n, results, started)
    for _ in range(n):
        assert started.acquire(timeout=60), f"the load did not start: {results}"
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    for t in ts:
        t.join(30)
    assert len(results) == n
    errors = [(code, err, t - killed) for code, err, t in results if err]
    assert errors, results  # the requests were still running when it died
    for code, err, dt in errors:
        assert dt < 5.0, (err, dt)
    return errors
