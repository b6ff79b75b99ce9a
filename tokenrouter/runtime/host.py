"""What machine a figure was measured on: CPU model, cores, load, memory read bandwidth.

Every benchmark, profile, kernel plan, eval and fitting report carries these, because the
same code measures differently on another host (decode is bound by memory bandwidth, and
MKL's matrix-vector product was measured 2.6x slower than a plain read on one Zen 3 host).
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    """The CPU's feature flags (what the kernels can use), '' where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("flags")), "")
    except OSError:
        return ""


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (figures from a loaded host are not comparable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def read_bandwidth_gb_s(mb: int = 256, repeats: int = 3) -> float:
    """Measured memory read bandwidth: the best of a few sums over a buffer far larger than
    the caches (decode steps are bandwidth-bound, so this is the host figure that matters)."""
    a = np.ones(mb * 2**20 // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return round(a.nbytes / best / 1e9, 2)


def host_info(bandwidth: bool = True) -> dict:
    """{"cpu", "cores", "load_average", "date" (UTC, ISO 8601), "read_gb_per_s"} (the last
    measured, about 0.3 s)."""
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "load_average": load_average(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if bandwidth:
        info["read_gb_per_s"] = read_bandwidth_gb_s()
    return info
