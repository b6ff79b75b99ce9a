"""Faults against a served program: recovery from kill -9, overload at the door, idle
connections, abandoned streams.

    .venv/bin/python benchmarks/faults.py examples/demo.route --out bench-results/faults \
        [--kills 3] [--concurrency 16] [--overload 300] [--idle 5000] [--abandon 16] [-- EXTRA SERVE ARGS]

Starts `tokenrouter serve FILE` (its own process, default limits) and measures, in one run:

1. recovery: `--concurrency` greedy streamed requests run; once every one has its first token,
   one subserver is killed with SIGKILL, the writers in turn, `--kills` times each. For each
   kill: how many requests were in flight, when /health turned 503 (the death noticed) and 200 again (a new process ready), how
   long a one-token request then took, when the last request finished, how many failed and
   how many differ from the same requests served without a kill (greedy, `ignore_eos`, so
   every request is in flight at the kill: the single-request
   reference's tokens, by invariant 5), and the /metrics counters of resumed requests and
   re-prefills;
2. overload: `--overload` requests at once with the default limits (`--max-running` 64,
   `--max-queue` half of it): how many were admitted, how many got 503 and whether each
   carried `Retry-After`, and the admitted requests' latency p50 / p99;
3. idle connections: `--idle` connections that never send a request, then one normal request:
   its latency, the connections the server evicted at its cap, and how much the server's
   log grew;
4. abandoned streams (vLLM's recovery check): a 10-token greedy request's latency, 3 times
   before and 4 times after `--abandon` streaming requests of 200 tokens that the client
   drops at their first chunk, and how long until every KV block is free again.

Writes faults.json (with the host: CPU, cores, load average, measured read bandwidth); the
docs' tables are made from it by scripts/results_tables.py (table `faults`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import time

from _serve import free_port, metrics, parse_with_serve_args, pct, start_serve, stop_serve, wait_healthy
from tokenrouter.runtime.host import host_info, load_average

TOPICS = ["the printing press", "vaccines", "why the sky is blue", "chess openings", "compilers",
          "the water cycle", "inflation", "bees", "plate tectonics", "transistors", "stars", "bread",
          "tides", "volcanoes", "the moon", "rivers"]


def _sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


async def _stream(c, prompt: str, max_tokens: int, first: asyncio.Event | None = None):
    """(status or 'error', token ids) of one greedy streamed completion."""
    ids, err = [], None
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0, "stream": True,
            "ignore_eos": True}  # every request runs to max_tokens: all are in flight at the kill
    async with c.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                err = data["error"].get("message")
                break
            for ch in data.get("choices", []):
                ids += ch.get("token_ids", [])
            if first is not None and ids:
                first.set()
        return (r.status_code if err is None else f"error: {err}"), ids


async def _recovery(url: str, args, writers: list[str]) -> dict:
    import httpx
    prompts = [f"Explain {t} in two sentences." for t in TOPICS[:args.concurrency]]
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        want = await asyncio.gather(*(_stream(c, p, args.max_tokens) for p in prompts))
        assert all(s == 200 for s, _ in want), want
        kills = []
        for k in range(args.kills):
            for w in writers:
                kills.append(await _kill_once(c, w, prompts, [ids for _, ids in want], args))
                print(f"kill {len(kills)}: {kills[-1]}", flush=True)
    return {"prompts": len(prompts), "max_tokens": args.max_tokens, "kills": kills}


async def _kill_once(c, writer: str, prompts: list[str], want: list[list[int]], args) -> dict:
    before = metrics((await c.get("/metrics")).text)
    firsts = [asyncio.Event() for _ in prompts]
    t_start = time.monotonic()
    runs = [asyncio.create_task(_stream(c, p, args.max_tokens, f)) for p, f in zip(prompts, firsts)]
    await asyncio.gather(*(f.wait() for f in firsts))
    pid = (await c.get("/health")).json()["subservers"][writer]["pid"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    unfinished = sum(1 for r in runs if not r.done())
    noticed = ready = probe = None
    while ready is None and time.monotonic() - t0 < 300:
        r = await c.get("/health")
        if r.status_code == 503 and noticed is None:
            noticed = time.monotonic() - t0
        elif r.status_code == 200 and r.json()["subservers"][writer]["pid"] != pid:
            ready = time.monotonic() - t0
        await asyncio.sleep(0.05)
    if ready is not None:
        t1 = time.monotonic()
        p = await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0})
        probe = round(time.monotonic() - t1, 3) if p.status_code == 200 else f"status {p.status_code}"
    results = await asyncio.gather(*runs)
    done = time.monotonic() - t0
    after = metrics((await c.get("/metrics")).text)
    return {"writer": writer, "in_flight": unfinished, "killed_after_s": round(t0 - t_start, 2),
            "noticed_s": None if noticed is None else round(noticed, 3),
            "ready_again_s": None if ready is None else round(ready, 2), "one_token_request_after_ready_s": probe,
            "all_done_s": round(done, 2), "failed": sum(1 for s, _ in results if s != 200),
            "differ": sum(1 for (s, ids), w in zip(results, want) if s == 200 and ids != w),
            "resumed": _sum(after, "tokenrouter_requests_resumed_total") - _sum(before, "tokenrouter_requests_resumed_total"),
            "reprefills": _reprefills(before, after, writer)}


def _reprefills(before: dict[str, float], after: dict[str, float], killed: str) -> float:
    """Re-prefills since `before`: all of the killed writer's new process (its counters
    start at 0), the growth of the others'."""
    name = "tokenrouter_reprefills_total{model=\"%s\"}"
    return sum(after.get(name % w, 0) - (0 if w == killed else before.get(name % w, 0))
               for w in {k.split('"')[1] for k in after if k.startswith("tokenrouter_reprefills_total{")})


async def _overload(url: str, n: int, max_tokens: int) -> dict:
    import httpx
    lat, codes, retry = [], {}, 0
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as c:
        async def one(i):
            nonlocal retry
            t0 = time.monotonic()
            r = await c.post("/v1/completions", json={"prompt": f"Write about {TOPICS[i % len(TOPICS)]} ({i}).",
                                                      "max_tokens": max_tokens, "temperature": 0})
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            if r.status_code == 200:
                lat.append(time.monotonic() - t0)
            elif r.status_code == 503 and r.headers.get("retry-after"):
                retry += 1
        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.monotonic() - t0
    return {"requests": n, "max_tokens": max_tokens, "status": codes, "503_with_retry_after": retry,
            "admitted_latency_s": {"p50": pct(lat, 0.5, 3), "p99": pct(lat, 0.99, 3), "n": len(lat)},
            "wall_s": round(wall, 1)}


def _idle(url: str, n: int, log_path: str) -> dict:
    import httpx
    host, port = url.removeprefix("http://").split(":")
    log0 = os.path.getsize(log_path)
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection((host, int(port))))
        time.sleep(3)  # the server takes them all
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "temperature": 0},
                       timeout=120)
        served = time.monotonic() - t0
        m = metrics(httpx.get(url + "/metrics", timeout=30).text)
    finally:
        for s in socks:
            s.close()
    return {"idle_connections": n, "status": r.status_code, "request_s": round(served, 3),
            "evicted": m.get('tokenrouter_http_connections_closed_total{reason="evicted"}', 0),
            "open": m.get("tokenrouter_http_connections_open"),
            "log_growth_bytes": os.path.getsize(log_path) - log0}


async def _abandon(url: str, n: int) -> dict:
    """`n` streams dropped at their first chunk, between a 10-token request's timings."""
    import httpx
    probe = {"prompt": "The capital of France is", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def timed() -> float:
            t0 = time.monotonic()
            r = await c.post("/v1/completions", json=probe)
            assert r.status_code == 200, r.text
            return round(time.monotonic() - t0, 3)

        async def drop(i: int) -> None:
            body = {"prompt": f"Tell me a long story about {TOPICS[i % len(TOPICS)]}.", "max_tokens": 200,
                    "stream": True, "ignore_eos": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return  # the client goes away: the server aborts the request

        before = [await timed() for _ in range(3)]
        await asyncio.gather(*(drop(i) for i in range(n)))
        t0 = time.monotonic()
        after = [await timed() for _ in range(4)]
        freed = None
        while freed is None and time.monotonic() - t0 < 120:
            if _sum(metrics((await c.get("/metrics")).text), "tokenrouter_kv_blocks_used") == 0:
                freed = round(time.monotonic() - t0, 2)
            else:
                await asyncio.sleep(0.05)
    return {"abandoned": n, "before_s": before, "after_s": after, "kv_free_after_s": freed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--kills", type=int, default=3, help="kills per subserver (default 3)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--overload", type=int, default=300)
    ap.add_argument("--overload-max-tokens", type=int, default=32)
    ap.add_argument("--idle", type=int, default=5000)
    ap.add_argument("--abandon", type=int, default=16, help="streams dropped at their first chunk (default 16)")
    ap.add_argument("--out", default="bench-results/faults")
    args, extra = parse_with_serve_args(ap, argv)
    os.makedirs(args.out, exist_ok=True)
    doc = {"host_before": host_info(), "file": args.file, "serve_args": extra}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(args.out, "serve.log")
    log = open(log_path, "w")
    proc = start_serve(args.file, port, ["--concurrency", str(args.concurrency), *extra], log)
    try:
        health = wait_healthy(proc, url, 900, log_path)
        if health is None:
            return 2
        writers = sorted(health["subservers"])
        doc["recovery"] = asyncio.run(_recovery(url, args, writers))
        doc["overload"] = asyncio.run(_overload(url, args.overload, args.overload_max_tokens))
        print(f"overload: {doc['overload']}", flush=True)
        doc["idle"] = _idle(url, args.idle, log_path)
        print(f"idle: {doc['idle']}", flush=True)
        doc["abandoned"] = asyncio.run(_abandon(url, args.abandon))
        print(f"abandoned: {doc['abandoned']}", flush=True)
        doc["host_after"] = {"load_average": load_average()}
    finally:
        stop_serve(proc, 120)
        log.close()
    with open(os.path.join(args.out, "faults.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {os.path.join(args.out, 'faults.json')}")
    bad = sum(k["failed"] + k["differ"] for k in doc["recovery"]["kills"])
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
