"""Load and contention: `tokenrouter serve` under steady load while other processes on the
host convert and load a model again and again and write gigabytes to disk. A busy host must
not make the runtime kill healthy subservers, and no body may get a server error.

    .venv/bin/python benchmarks/contention.py examples/bench.route --duration 600 --concurrency 12 \\
        --gguf /work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --write-gib 1 --fuzz 2400 \\
        --out benchmarks/results/contention [-- EXTRA SERVE ARGS]

Starts `tokenrouter serve FILE` (its own process, with its subservers) and waits until it is
healthy. Then, for `--duration` seconds:

- the *convert hog* (`--hog convert GGUF`, its own process, at normal priority): loads the
  GGUF file with tokenrouter's loader into a fresh temporary cache, which converts it
  (dequantised to float32 safetensors, written to disk) and reads it back, then drops it and
  removes the cache; again and again;
- the *disk hog* (`--hog disk GIB:PAUSE`): `dd if=/dev/zero of=TMP bs=1M count=GIB*1024
  conv=fsync`, then removes the file and waits `--write-pause-s` (the host's disk is shared:
  without a pause dd writes hundreds of GB in ten minutes); again and again;
- `--concurrency` clients send completions one after another (as benchmarks/soak.py:
  greedy and sampled, streamed and not, max_tokens 8..`--max-tokens`). A 503 is sent again
  after its `Retry-After`, and counted by its code: `overloaded` is shedding (the admission
  queue is full), anything else an outage;
- with `--fuzz N`, the N fuzzed bodies of tests/runtime/http/test_http_fuzz.py (tests/helpers/
  fuzz.py) go to both endpoints too, at concurrency 8, while the rest runs;
- /metrics is read every `--sample-s`: each subserver's restarts and the longest gaps the
  frontend saw between two of its heartbeats and between two signs of its progress (the
  jitter the heartbeat timeout and the stall window must outlast), with the load average
  and the memory available.

Writes contention.json to --out (the host before and after, what each hog did, every
status counted, latency p50 / p99 of completed requests, the liveness figures, the series),
and exits non-zero on a restart, a server error (5xx other than shedding) or an outage 503.
The hogs' files are removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _serve import (ROOT, free_port, metrics, parse_with_serve_args, pct, start_serve, stop_serve, stopped_within,
                    wait_healthy)
from tokenrouter.runtime.host import host_info, load_average

TOPICS = ["the printing press", "vaccines", "why the sky is blue", "chess openings", "compilers", "bees"]


# ---------------------------------------------------------------------- the hogs

def hog_convert(gguf: str) -> None:
    """Convert and load `gguf` into a fresh cache, forever; a JSON line per round."""
    from tokenrouter.runtime.loader import load_model
    while True:
        cache = tempfile.mkdtemp(prefix=f"contention-{os.getpid()}-cache-")
        os.environ["TOKENROUTER_CACHE"] = cache
        t0 = time.monotonic()
        try:
            m = load_model(gguf)
            params = sum(w.numel() for w in m.weights.values())
            written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs)
            del m
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        print(json.dumps({"params": params, "bytes_written": written, "seconds": round(time.monotonic() - t0, 1)}),
              flush=True)


def hog_disk(gib: float, pause_s: float) -> None:
    """Write `gib` GiB with dd and fsync, remove it, wait `pause_s`, forever; a JSON line per round."""
    path = os.path.join(tempfile.gettempdir(), f"contention-{os.getpid()}-dd")
    try:
        while True:
            t0 = time.monotonic()
            subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={int(gib * 1024)}", "conv=fsync",
                            "status=none"], check=True)
            os.remove(path)
            print(json.dumps({"bytes_written": int(gib * (1 << 30)), "seconds": round(time.monotonic() - t0, 1)}),
                  flush=True)
            time.sleep(pause_s)
    finally:
        if os.path.exists(path):
            os.remove(path)


def start_hog(kind: str, arg: str, log_path: str) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hog", kind, arg], stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def hog_rounds(log_path: str) -> list[dict]:
    with open(log_path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


# ---------------------------------------------------------------------- the load

def _count(stats: dict, key: str) -> None:
    stats["by_status"][key] = stats["by_status"].get(key, 0) + 1


def _verdict(status: int, text: str) -> str:
    """How an answer counts: its status, and a 503 by its code (shedding or an outage)."""
    if status != 503:
        return str(status)
    return "503 shed" if '"overloaded"' in text else "503 outage"


async def _load(url: str, args, stats: dict, stop: asyncio.Event) -> None:
    import httpx
    rng = random.Random(args.seed)

    async def attempt(c, body: dict, stream: bool) -> tuple[str, float | None]:
        if not stream:
            r = await c.post("/v1/completions", json=body)
            return _verdict(r.status_code, r.text), float(r.headers.get("retry-after", 1))
        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                return _verdict(r.status_code, (await r.aread()).decode()), float(r.headers.get("retry-after", 1))
            async for line in r.aiter_lines():
                if line.startswith('data: {"error"'):
                    stats["errors"].append(line[:300])
                    return "200 with an error event", None
        return "200", None

    async def client(i: int, c) -> None:
        while not stop.is_set():
            body = {"prompt": f"Write about {rng.choice(TOPICS)} (client {i}, {stats['sent']}).",
                    "max_tokens": rng.randint(8, args.max_tokens), "temperature": rng.choice([0.0, 0.7])}
            stream = rng.random() < 0.3
            stats["sent"] += 1
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    verdict, retry = await attempt(c, body, stream)
                except httpx.HTTPError as exc:
                    verdict, retry = "transport error", 1.0
                    stats["errors"].append(f"{type(exc).__name__}: {exc}"[:300])
                _count(stats, verdict)
                if verdict == "200":
                    stats["latency_s"].append(time.monotonic() - t0)
                if not verdict.startswith("503"):
                    break
                await asyncio.sleep(retry or 1.0)

    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout, limits=limits) as c:
        await asyncio.gather(*(client(i, c) for i in range(args.concurrency)))


async def _fuzz(url: str, n: int, fuzz: dict) -> None:
    """The fuzzed bodies (tests/helpers/fuzz.py), at concurrency 8."""
    import httpx
    sys.path.insert(0, ROOT)
    from tests.helpers.fuzz import bodies
    sem = asyncio.Semaphore(8)
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def one(path: str, b: dict) -> None:
            async with sem:
                r = await c.post(path, content=json.dumps(b), headers={"content-type": "application/json"})
                verdict = _verdict(r.status_code, r.text)
                if r.status_code == 200 and '"server_error"' in r.text:
                    verdict = "200 with an error event"
                fuzz["by_status"][verdict] = fuzz["by_status"].get(verdict, 0) + 1
                if r.status_code >= 500 or verdict == "200 with an error event":
                    fuzz["server_errors"].append({"path": path, "body": json.dumps(b)[:300], "status": r.status_code,
                                                  "answer": r.text[:300]})
        await asyncio.gather(*(one(p, b) for p, b in bodies(n=n)))
    fuzz["seconds"] = round(time.monotonic() - t0, 1)


def _meminfo_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return round(int(line.split()[1]) / (1 << 20), 2)
    except OSError:
        return None
    return None


def _labelled(m: dict[str, float], name: str) -> dict[str, float]:
    return {k.split('"')[1]: v for k, v in m.items() if k.startswith(name + "{")}


async def _sample(url: str, series: list, stats: dict, t0: float, every: float, stop: asyncio.Event) -> None:
    import httpx
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while True:
            row = {"t": round(time.monotonic() - t0, 1), "load_1m": load_average()[0], "mem_available_gb": _meminfo_gb(),
                   "answers": dict(stats["by_status"])}
            try:
                m = metrics((await c.get("/metrics")).text)
                row.update(restarts=_labelled(m, "tokenrouter_subserver_restarts_total"),
                           up=_labelled(m, "tokenrouter_subserver_up"),
                           heartbeat_gap_max_s=_labelled(m, "tokenrouter_subserver_heartbeat_gap_max_seconds"),
                           progress_gap_max_s=_labelled(m, "tokenrouter_subserver_progress_gap_max_seconds"))
            except httpx.HTTPError as exc:
                row["metrics_error"] = str(exc)
            series.append(row)
            if await stopped_within(stop, every):
                return


# ---------------------------------------------------------------------- the run

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load and contention (default 600)")
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--gguf", help="the GGUF model the convert hog converts and loads (required)")
    ap.add_argument("--write-gib", type=float, default=1.0, help="GiB the disk hog writes (and fsyncs) a round")
    ap.add_argument("--write-pause-s", type=float, default=10.0, help="seconds the disk hog waits between rounds")
    ap.add_argument("--fuzz", type=int, default=0, metavar="N", help="also send N fuzzed bodies")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/contention")
    ap.add_argument("--hog", nargs=2, metavar=("KIND", "ARG"), help=argparse.SUPPRESS)  # a hog process
    args, extra = parse_with_serve_args(ap, argv)
    if args.hog:
        kind, arg = args.hog
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # stopped: remove what it wrote
        if kind == "convert":
            hog_convert(arg)
        else:
            gib, pause = arg.split(":")
            hog_disk(float(gib), float(pause))
        return 0
    if not args.file or not args.gguf:
        ap.error("the program file and --gguf are required")
    os.makedirs(args.out, exist_ok=True)
    info = {"host_before": host_info(), "file": args.file, "duration_s": args.duration,
            "concurrency": args.concurrency, "max_tokens": args.max_tokens, "serve_args": extra,
            "command": " ".join(["python", "benchmarks/contention.py", *(sys.argv[1:] if argv is None else argv)])}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_log = open(os.path.join(args.out, "serve.log"), "w")
    proc = start_serve(args.file, port, ["--concurrency", str(args.concurrency), *extra], serve_log)
    hogs: list[subprocess.Popen] = []
    hog_logs = {"convert": os.path.join(args.out, "hog-convert.log"), "disk": os.path.join(args.out, "hog-disk.log")}
    try:
        if wait_healthy(proc, url, 600, serve_log.name) is None:
            return 2
        stats = {"sent": 0, "by_status": {}, "latency_s": [], "errors": []}
        fuzz = {"bodies": args.fuzz, "by_status": {}, "server_errors": []}
        series: list = []
        hogs = [start_hog("convert", args.gguf, hog_logs["convert"]),
                start_hog("disk", f"{args.write_gib}:{args.write_pause_s}", hog_logs["disk"])]
        print(f"hogs: convert {args.gguf} (pid {hogs[0].pid}), dd {args.write_gib} GiB + fsync every "
              f"{args.write_pause_s:g} s (pid {hogs[1].pid})", flush=True)

        async def run():
            stop_load, stop_sample = asyncio.Event(), asyncio.Event()
            t0 = time.monotonic()
            sampler = asyncio.create_task(_sample(url, series, stats, t0, args.sample_s, stop_sample))
            load = asyncio.create_task(_load(url, args, stats, stop_load))
            fuzzing = asyncio.create_task(_fuzz(url, args.fuzz, fuzz)) if args.fuzz else None
            while time.monotonic() - t0 < args.duration:
                await asyncio.sleep(30)
                print(f"[{time.monotonic() - t0:5.0f} s] {stats['by_status']} fuzz {fuzz['by_status']}", flush=True)
            stop_load.set()
            await load
            if fuzzing is not None:
                await fuzzing
            stop_sample.set()
            await sampler

        asyncio.run(run())
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            try:
                h.wait(60)
            except subprocess.TimeoutExpired:
                h.kill()
        for h in hogs:  # what a hog killed mid-round left behind
            for leftover in glob.glob(os.path.join(tempfile.gettempdir(), f"contention-{h.pid}-*")):
                shutil.rmtree(leftover, ignore_errors=True) if os.path.isdir(leftover) else os.remove(leftover)
        stop_serve(proc, 60)
        serve_log.close()
    convert, disk = hog_rounds(hog_logs["convert"]), hog_rounds(hog_logs["disk"])
    last = series[-1]
    lat = stats["latency_s"]
    answers = stats["by_status"]
    server_errors = sum(n for k, n in answers.items() if k[0] == "5" and k != "503 shed") + \
        answers.get("200 with an error event", 0)
    result = {**info, "host_after": {"load_average": load_average()},
              "hogs": {"convert": {"what": f"tokenrouter's loader converting {os.path.basename(args.gguf)} into a "
                                           f"fresh cache (float32 safetensors) and loading it, again and again",
                                   "rounds": len(convert), "bytes_written": sum(r["bytes_written"] for r in convert),
                                   "round_seconds": [r["seconds"] for r in convert]},
                       "disk": {"what": f"dd if=/dev/zero bs=1M count={int(args.write_gib * 1024)} conv=fsync, then rm "
                                        f"and {args.write_pause_s:g} s of pause, again and again", "rounds": len(disk),
                                "bytes_written": sum(r["bytes_written"] for r in disk),
                                "round_seconds": [r["seconds"] for r in disk]}},
              "requests": {"sent": stats["sent"], "answers": answers, "server_errors": server_errors,
                           "outage_503": answers.get("503 outage", 0), "shed_503": answers.get("503 shed", 0)},
              "latency_s": {"p50": pct(lat, 0.5, 3), "p99": pct(lat, 0.99, 3), "max": pct(lat, 1.0, 3), "n": len(lat)},
              "fuzz": fuzz,
              "liveness": {"restarts": last.get("restarts"), "heartbeat_gap_max_s": last.get("heartbeat_gap_max_s"),
                           "progress_gap_max_s": last.get("progress_gap_max_s")},
              "load_1m_max": max(r["load_1m"] for r in series),
              "mem_available_gb_min": min(r["mem_available_gb"] for r in series if r["mem_available_gb"] is not None),
              "errors_sample": stats["errors"][:20], "series": series}
    with open(os.path.join(args.out, "contention.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("requests", "latency_s", "liveness", "hogs")}, indent=1))
    restarts = sum((last.get("restarts") or {}).values())
    bad = restarts or server_errors or answers.get("503 outage", 0) or fuzz["server_errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
