"""Soak: keep a served program under steady load for a given time and check nothing is lost.

    .venv/bin/python benchmarks/soak.py examples/bench.route --duration 3600 --concurrency 64 \
        [--out bench-results/soak] [--sample-s 10] [-- EXTRA SERVE ARGS]

Starts `tokenrouter serve FILE` (its own process, with its subservers), measures the KV
blocks in use and every process's RSS before any load, then runs `--concurrency` clients
that each send one completion after another (greedy and sampled, streamed and not,
max_tokens drawn from 8..`--max-tokens`) for `--duration` seconds. Every `--sample-s` it
records each process's RSS (from /proc, the serve process and its subservers by writer,
a restarted subserver is followed) and the KV blocks in use from /metrics. At the end it
stops sending, waits for the requests in flight, and reports:

  sent / completed / failed / lost (lost: sent and never answered by the end of the grace
  period), latency p50 / p99 of completed requests, KV blocks at the start and the end
  (after the last release), RSS per process over time and its growth after the warm-up
  (the first 10 minutes, or the first sixth of a shorter run; for a subserver killed during
  the run, its last process's growth after that process's own warm-up).

The clients are polite: a 503 (the server at capacity, or a subserver restarting) is
counted as refused and the same request is sent again after its `Retry-After`.

With `--kill-every S` it also kills -9 one subserver every S seconds, the writers in turn
(the first after S seconds; `--duration 1800 --kill-every 600` kills each of a pair once),
and records for each kill how many requests were in flight, how many of them failed (none
should: the runtime resumes what the dead process held) and when /health was ok again
(serving resumed, without a restart of `tokenrouter serve`).

Writes soak.json and soak.png to --out, and exits non-zero when a request was lost or
failed, or the KV blocks did not come back to their starting level. Also records the host (CPU model,
cores, load average, a measured memory read bandwidth): figures from a shared machine
are noisy, and the load average says how noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

from _serve import (free_port, metrics, parse_with_serve_args, pct, start_serve, stop_serve, stopped_within,
                    wait_healthy)
from tokenrouter.runtime.host import host_info, load_average

TOPICS = ["the printing press", "vaccines", "why the sky is blue", "chess openings", "compilers",
          "the water cycle", "inflation", "bees", "plate tectonics", "transistors", "stars", "bread"]


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _blocks(m: dict[str, float]) -> dict[str, float]:
    return {k.split('"')[1]: v for k, v in m.items() if k.startswith("tokenrouter_kv_blocks_used{")}


async def _load(url: str, args, stats: dict, stop: asyncio.Event) -> None:
    import httpx
    rng = random.Random(args.seed)

    async def attempt(c: httpx.AsyncClient, body: dict, stream: bool) -> tuple[bool, float | None]:
        """(finished, Retry-After of a 503 to wait before sending it again, or None)."""
        if stream:
            ok = False
            async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                if r.status_code == 503:
                    return False, float(r.headers.get("retry-after", 1))
                async for line in r.aiter_lines():
                    if line.startswith('data: {"error"'):
                        stats["errors"].append(line[:200])
                        break
                    if '"finish_reason": "' in line and '"finish_reason": null' not in line:
                        ok = r.status_code == 200
            return ok, None
        r = await c.post("/v1/completions", json=body)
        if r.status_code == 503:
            return False, float(r.headers.get("retry-after", 1))
        if r.status_code != 200:
            stats["errors"].append(f"{r.status_code} {r.text[:200]}")
        return r.status_code == 200, None

    async def client(i: int, c: httpx.AsyncClient) -> None:
        while not stop.is_set():
            body = {"prompt": f"Write about {rng.choice(TOPICS)} (client {i}, {stats['sent']}).",
                    "max_tokens": rng.randint(8, args.max_tokens),
                    "temperature": rng.choice([0.0, 0.7])}
            stream = rng.random() < 0.3
            stats["sent"] += 1
            t0 = time.monotonic()
            try:
                while True:  # a polite client: a 503 is sent again after its Retry-After
                    ok, retry = await attempt(c, body, stream)
                    if retry is None or stop.is_set():
                        break
                    stats["refused"] += 1
                    await asyncio.sleep(retry)
                    t0 = time.monotonic()
            except httpx.HTTPError as exc:
                ok = False
                stats["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
            if not ok:
                stats["fail_times"].append((t0, time.monotonic()))
            if ok:
                stats["completed"] += 1
                stats["latency_s"].append(time.monotonic() - t0)
            else:
                stats["failed"] += 1

    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout, limits=limits) as c:
        await asyncio.gather(*(client(i, c) for i in range(args.concurrency)))


async def _sample(url: str, proc: subprocess.Popen, series: list, stats: dict, t_start: float,
                  every: float, stop: asyncio.Event) -> None:
    import httpx
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        while True:
            row = {"t": round(time.monotonic() - t_start, 1), "completed": stats["completed"],
                   "failed": stats["failed"], "rss_mb": {"serve": _rss_mb(proc.pid)}}
            try:  # /health names each subserver's pid (a restarted one keeps its writer's name)
                subs = (await c.get("/health")).json().get("subservers", {})
                row["rss_mb"].update({w: _rss_mb(s["pid"]) for w, s in subs.items() if s.get("pid")})
                row["up"] = {w: s["up"] for w, s in subs.items()}
            except (httpx.HTTPError, ValueError):
                pass
            try:
                m = metrics((await c.get("/metrics")).text)
                row["kv_blocks_used"] = _blocks(m)
                row["running"] = m.get("tokenrouter_requests_running")
            except httpx.HTTPError as exc:
                row["metrics_error"] = str(exc)
            series.append(row)
            if await stopped_within(stop, every):
                return


async def _killer(url: str, every: float, kills: list, stats: dict, t0: float, duration: float) -> None:
    """kill -9 the subservers in turn; time the first failure and the recovery of each."""
    import httpx
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        turn = 0
        while time.monotonic() - t0 + every < duration:
            await asyncio.sleep(every)
            subs = (await c.get("/health")).json()["subservers"]
            writers = sorted(subs)
            w = writers[turn % len(writers)]
            turn += 1
            pid = subs[w]["pid"]
            running = metrics((await c.get("/metrics")).text).get("tokenrouter_requests_running")
            n_failed = len(stats["fail_times"])
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            resumed = None
            while time.monotonic() - t_kill < 120:
                await asyncio.sleep(0.2)
                r = await c.get("/health")
                if r.status_code == 200 and r.json()["subservers"][w]["pid"] != pid:
                    resumed = time.monotonic() - t_kill
                    break
            fails = stats["fail_times"][n_failed:]
            inflight = [end - t_kill for start, end in fails if start < t_kill]  # running when it died
            kills.append({"writer": w, "pid": pid, "t": round(t_kill - t0, 1), "in_flight": running,
                          "failed_in_flight": len(inflight),
                          "failed_new": len(fails) - len(inflight),
                          "in_flight_error_max_s": round(max(inflight), 3) if inflight else None,
                          "resumed_s": None if resumed is None else round(resumed, 2)})
            print(f"killed {w} (pid {pid}): {kills[-1]}", flush=True)


def _growth(series: list, warmup_s: float, kills: list | None = None) -> dict[str, dict]:
    """RSS per process at the end of the warm-up and at the end, and the growth in %. A writer
    killed during the run is measured over its last process's life: from that process's own
    warm-up (`warmup_s`, or half of what it lived if less) to the end, since a new process
    starts small and warms up again."""
    out = {}
    names = {n for row in series for n in row["rss_mb"]}
    for n in sorted(names):
        born = max([0.0, *(k["t"] for k in kills or () if k["writer"] == n)])
        pts = [(r["t"], r["rss_mb"].get(n)) for r in series if r["rss_mb"].get(n) and r["t"] >= born]
        if len(pts) < 2:
            continue
        warm = min(warmup_s, (pts[-1][0] - born) / 2) if born else warmup_s
        after = [p for p in pts if p[0] >= born + warm] or pts[-1:]
        a, b = after[0][1], pts[-1][1]
        last = pts[-max(2, len(pts) // 6):]  # slope over the last sixth: still rising?
        slope = (last[-1][0] - last[0][0]) and (last[-1][1] - last[0][1]) / (last[-1][0] - last[0][0])
        start = next(r["rss_mb"][n] for r in series if r["rss_mb"].get(n))
        out[n] = {"start_mb": start, "after_warmup_mb": a, "end_mb": b,
                  "growth_after_warmup_pct": round(100 * (b - a) / a, 2),
                  "slope_last_sixth_mb_per_s": round(slope, 4)}
        if born:
            out[n].update(process_started_s=born, after_warmup_t=after[0][0])
    return out


def _plot(path: str, series: list, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    t = [r["t"] for r in series]
    for n in sorted({n for r in series for n in r["rss_mb"]}):
        ax1.plot(t, [r["rss_mb"].get(n) for r in series], label=n)
    ax1.set_ylabel("RSS (MB)")
    ax1.legend(fontsize=8)
    ax1.set_title(title, fontsize=9)
    for w in sorted({w for r in series for w in r.get("kv_blocks_used", {})}):
        ax2.plot(t, [r.get("kv_blocks_used", {}).get(w) for r in series], label=f"KV blocks {w}")
    ax2b = ax2.twinx()
    ax2b.plot(t, [r["completed"] for r in series], "k--", label="completed")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("KV blocks used")
    ax2b.set_ylabel("requests completed")
    ax2.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of load (default 3600)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--grace-s", type=float, default=300.0, help="wait this long for requests in flight")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="client timeout per request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-every", type=float, default=None, metavar="S",
                    help="kill -9 one subserver every S seconds, writers in turn")
    ap.add_argument("--out", default="bench-results/soak")
    args, extra = parse_with_serve_args(ap, argv)
    os.makedirs(args.out, exist_ok=True)
    info = {"host_before": host_info(), "file": args.file, "duration_s": args.duration, "kill_every_s": args.kill_every,
            "concurrency": args.concurrency, "max_tokens": args.max_tokens, "serve_args": extra}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.out, "serve.log"), "w")
    proc = start_serve(args.file, port, ["--concurrency", str(args.concurrency),
                                         "--max-running", str(max(64, args.concurrency)), *extra], log)
    try:
        import httpx
        if wait_healthy(proc, url, 600, log.name) is None:
            return 2
        kv_start = _blocks(metrics(httpx.get(url + "/metrics", timeout=10).text))
        stats = {"sent": 0, "completed": 0, "failed": 0, "refused": 0, "latency_s": [], "errors": [],
                 "fail_times": []}
        kills: list = []
        series: list = []

        async def run():
            stop_load, stop_sample = asyncio.Event(), asyncio.Event()
            t0 = time.monotonic()
            sampler = asyncio.create_task(_sample(url, proc, series, stats, t0, args.sample_s, stop_sample))
            load = asyncio.create_task(_load(url, args, stats, stop_load))
            killer = (asyncio.create_task(_killer(url, args.kill_every, kills, stats, t0, args.duration))
                      if args.kill_every else None)
            last = 0.0
            while time.monotonic() - t0 < args.duration:
                await asyncio.sleep(1)
                if time.monotonic() - last > 30:
                    last = time.monotonic()
                    print(f"[{time.monotonic() - t0:6.0f} s] sent {stats['sent']} completed {stats['completed']} "
                          f"failed {stats['failed']}", flush=True)
            if killer is not None:
                await killer
            stop_load.set()  # no new requests; wait for those in flight
            try:
                await asyncio.wait_for(load, args.grace_s)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(3)  # releases are asynchronous
            stop_sample.set()
            await sampler

        asyncio.run(run())
        kv_end = _blocks(metrics(httpx.get(url + "/metrics", timeout=10).text))
        lost = stats["sent"] - stats["completed"] - stats["failed"]
        warmup = 600.0 if args.duration >= 1800 else args.duration / 6
        lat = stats["latency_s"]
        result = {**info, "host_after": {"load_average": load_average()},
                  "requests": {"sent": stats["sent"], "completed": stats["completed"], "failed": stats["failed"],
                               "lost": lost, "refused_503_then_sent_again": stats["refused"]},
                  "latency_s": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "n": len(lat)},
                  "kv_blocks_used": {"start": kv_start, "end": kv_end},
                  "warmup_s": warmup, "rss": _growth(series, warmup, kills),
                  "kills": kills, "errors_sample": stats["errors"][:20], "series": series}
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump(result, f, indent=1)
        _plot(os.path.join(args.out, "soak.png"), series,
              f"{os.path.basename(args.file)}, concurrency {args.concurrency}, {args.duration:.0f} s; "
              f"{info['host_before']['cpu']}, load {info['host_before']['load_average'][0]:.1f}")
        print(json.dumps({k: result[k] for k in ("requests", "latency_s", "kv_blocks_used", "rss", "kills")}, indent=1))
        return 0 if lost == 0 and stats["failed"] == 0 and kv_end == kv_start else 1
    finally:
        stop_serve(proc, 60)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
