"""What the benchmarks that run `tokenrouter serve` as a user does share (faults.py, soak.py):
their command line split at `--` (what follows goes to serve), a free port, serve started
with its output in a log, waited for until /health is ok, its /metrics read, percentiles,
and serve stopped.

Not a benchmark itself: the scripts import it as a sibling module (`python
benchmarks/faults.py` puts benchmarks/ first on sys.path).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def parse_with_serve_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(the script's own arguments, the extra `tokenrouter serve` arguments after `--`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return ap.parse_args(argv[:cut]), argv[cut + 1:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(file: str, port: int, args: list[str], log) -> subprocess.Popen:
    """`tokenrouter serve FILE --port PORT ARGS...` in its own process, from the repository
    root, its output to the open file `log`."""
    return subprocess.Popen([sys.executable, "-m", "tokenrouter.cli", "serve", file, "--port", str(port), *args],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, log_path: str) -> dict | None:
    """/health's answer once it is 200; None, said on stderr, when serve exits first or does
    not come up within `timeout_s`."""
    import httpx
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            print(f"serve exited with {proc.returncode}; see {log_path}", file=sys.stderr)
            return None
        try:
            r = httpx.get(url + "/health", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            print("serve did not come up", file=sys.stderr)
            return None
        time.sleep(1)


def stop_serve(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGINT, as Ctrl-C (serve stops its subservers); SIGKILL if it is still running after
    `timeout_s`."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def metrics(text: str) -> dict[str, float]:
    """A /metrics text as {sample as written, labels and all: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def pct(xs: list[float], q: float, digits: int | None = None) -> float | None:
    """The q-quantile of `xs` (the sorted values' entry int(q * n), the last for q = 1),
    rounded to `digits` if given; None for no values."""
    if not xs:
        return None
    x = sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]
    return x if digits is None else round(x, digits)


async def stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait until `stop` is set or `seconds` pass: whether it was set (a sampler's period)."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False
