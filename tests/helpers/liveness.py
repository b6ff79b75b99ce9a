"""Serving under faults: streamed load, killing a subserver under it, checking answers
against the single-request reference (the liveness, recovery and network-namespace tests)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import httpx

from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.reference import Reference


def stream_tokens(c: httpx.Client, body: dict, started: threading.Semaphore) -> tuple[int, str | None, list[int]]:
    """One streamed completion of `body` on client `c`: (HTTP status, the error chunk or None,
    the token ids). `started` is released at its first chunk; a response with no chunk (a
    503, say) releases it at its end, and its body is the error."""
    ids, err, first, other = [], None, True, []
    with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break
            if not line.startswith("data: {"):
                other.append(line)
                continue
            if first:
                started.release()
                first = False
            if '"error"' in line:
                err = line
            else:
                choices = json.loads(line[6:])["choices"]
                ids += choices[0].get("token_ids", []) if choices else []
        if first:
            started.release()
            err = err or "\n".join(other)
    return r.status_code, err, ids


LOAD_BODY = {"max_tokens": 200, "temperature": 0, "seed": 0, "ignore_eos": True}


def load_prompt(i: int) -> str:
    return f"load {i}"


def stream_load(url, n, results, started):
    """n long greedy streamed requests (`LOAD_BODY`, prompt `load_prompt(i)`); record
    (status, error text, end time, token ids) for each."""
    def one(i):
        with httpx.Client(base_url=url, timeout=120) as c:
            status, err, ids = stream_tokens(c, {"prompt": load_prompt(i), **LOAD_BODY}, started)
            results.append((status, err, time.monotonic(), ids))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts


def load_reference(program, tokenizer, n) -> set[tuple[int, ...]]:
    """The single-request reference's tokens for the n prompts of `stream_load`."""
    ref = Reference(program)
    params = SamplingParams(max_tokens=LOAD_BODY["max_tokens"])
    return {tuple(ref.generate(tokenizer.encode(load_prompt(i)), params).tokens) for i in range(n)}


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


def kill_under_load(url, pid, n=4, then=None, timeout=60):
    """Kill -9 `pid` while n long streamed requests run, call `then()` (a restart of a remote
    subserver, say), and wait for them: [(status, error text or None, end time, token ids)]."""
    return signal_under_load(url, pid, signal.SIGKILL, n, then, timeout)


def signal_under_load(url, pid, signum, n=4, then=None, timeout=60):
    """Send `signum` to `pid` while n long streamed requests run (`stream_load`), call
    `then()`, and wait for them: [(status, error text or None, end time, token ids)]."""
    results, started = [], threading.Semaphore(0)
    ts = stream_load(url, n, results, started)
    for _ in range(n):
        assert started.acquire(timeout=60), f"the load did not start: {results}"
    os.kill(pid, signum)
    if then is not None:
        then()
    for t in ts:
        t.join(timeout)
    assert len(results) == n, results
    return results


def ip(*args, check=True) -> subprocess.CompletedProcess:
    """`ip ARGS` (iproute2), its output captured."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def can_make_netns() -> bool:
    """Whether this machine lets us make a network namespace (probed with a throwaway one)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    name = f"tr16-probe-{os.getpid()}"
    if ip("netns", "add", name, check=False).returncode != 0:
        return False
    ip("netns", "delete", name, check=False)
    return True
