"""Counters each subserver keeps, and their rendering in the Prometheus text format.

A subserver owns a `SubserverStats` (plain numbers, updated by its decode loop); the
frontend asks every subserver for a snapshot (`wire.Stats`) and renders all of them, plus
its own request counters, for `GET /metrics`. Metric names are listed in docs/runtime.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

#: The parts of a step, in the order a step runs them.
PHASES = ("schedule", "forward", "sample", "route", "bookkeeping", "messaging")


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, non-cumulative, + overflow
    total: float = 0.0
    n: int = 0

    def __post_init__(self):
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.total, "count": self.n}


@dataclass
class SubserverStats:
    writer: str
    threads: int = 0
    batch_threshold: int = 1
    max_wait_s: float = 0.0
    tokens_written: int = 0  # committed tokens this writer produced
    tokens_rewritten: int = 0  # sampled here but dropped (the next writer rewrote them)
    steps: int = 0
    handoffs_out: dict[str, int] = field(default_factory=dict)  # peer -> count
    handoffs_in: dict[str, int] = field(default_factory=dict)
    suffix_tokens_in: int = 0  # tokens received in handoffs (the unseen suffixes)
    prefill_tokens: int = 0  # tokens fed to the engine, all kinds
    requests_finished: dict[str, int] = field(default_factory=dict)  # reason -> count
    phase_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    step_s: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    queue_wait_s: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    launch_reasons: dict[str, int] = field(default_factory=dict)
    frames_dropped: dict[str, int] = field(default_factory=dict)  # invalid | test_only | error

    def snapshot(self, **gauges: Any) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, Histogram)}
        out.update({k: v.to_dict() for k, v in self.__dict__.items() if isinstance(v, Histogram)})
        out.update(gauges)
        return out


# ------------------------------------------------------------------- rendering

def _labels(**kv: Any) -> str:
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in kv.items())
    return "{" + inner + "}" if inner else ""


class _Out:
    def __init__(self):
        self.lines: list[str] = []
        self._declared: set[str] = set()

    def declare(self, name: str, kind: str, help_: str) -> None:
        if name not in self._declared:
            self._declared.add(name)
            self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: Any) -> None:
        self.lines.append(f"{name}{_labels(**labels)} {float(value)!r}")

    def histogram(self, name: str, h: dict[str, Any], help_: str, **labels: Any) -> None:
        self.declare(name, "histogram", help_)
        cum = 0
        for le, c in zip(h["buckets"], h["counts"]):
            cum += c
            self.sample(f"{name}_bucket", cum, **labels, le=le)
        self.sample(f"{name}_bucket", cum + h["counts"][-1], **labels, le="+Inf")
        self.sample(f"{name}_sum", h["sum"], **labels)
        self.sample(f"{name}_count", h["count"], **labels)


def render(subservers: dict[str, dict[str, Any]], frontend: dict[str, Any]) -> str:
    """The Prometheus text exposition of every subserver snapshot and the frontend's counters."""
    o = _Out()
    for w, s in sorted(subservers.items()):
        simple = [
            ("tokenrouter_tokens_written_total", "counter", "Tokens this writer committed.", s["tokens_written"]),
            ("tokenrouter_tokens_rewritten_total", "counter", "Tokens this writer sampled that were rewritten by the next writer.", s["tokens_rewritten"]),
            ("tokenrouter_steps_total", "counter", "Engine steps run.", s["steps"]),
            ("tokenrouter_handoff_suffix_tokens_total", "counter", "Tokens received in handoffs (unseen suffixes only).", s["suffix_tokens_in"]),
            ("tokenrouter_engine_computed_tokens_total", "counter", "Tokens the writer's engine computed, by its own count (vLLM's scheduler for a vLLM writer).", s.get("engine_computed_tokens", 0)),
            ("tokenrouter_pending_requests", "gauge", "Requests away at a peer, KV kept here.", s.get("pending", 0)),
            ("tokenrouter_ready_requests", "gauge", "Requests ready to step here.", s.get("ready", 0)),
            ("tokenrouter_kv_blocks_used", "gauge", "KV cache blocks in use.", s.get("blocks_used", 0)),
            ("tokenrouter_kv_blocks_free", "gauge", "KV cache blocks free.", s.get("blocks_free", 0)),
            ("tokenrouter_threads", "gauge", "CPU threads of this subserver (torch.get_num_threads).", s["threads"]),
            ("tokenrouter_batch_threshold", "gauge", "Delayed-batching threshold B_i.", s["batch_threshold"]),
            ("tokenrouter_max_wait_seconds", "gauge", "Longest a ready request waits for a batch to fill.", s["max_wait_s"]),
        ]
        for name, kind, help_, value in simple:
            o.declare(name, kind, help_)
            o.sample(name, value, model=w)
        for key, name, help_ in (("handoffs_out", "tokenrouter_handoffs_out_total", "Requests this writer sent to a peer."),
                                 ("handoffs_in", "tokenrouter_handoffs_in_total", "Requests this writer received from a peer.")):
            o.declare(name, "counter", help_)
            for peer, n in sorted(s[key].items()):
                o.sample(name, n, model=w, peer=peer)
        o.declare("tokenrouter_step_phase_seconds_total", "counter",
                  "Time spent in each part of a step (schedule, forward, sample, route, bookkeeping, messaging).")
        for phase, v in s["phase_s"].items():
            o.sample("tokenrouter_step_phase_seconds_total", v, model=w, phase=phase)
        o.declare("tokenrouter_step_launches_total", "counter", "Why each step was launched (delayed batching).")
        for reason, n in sorted(s["launch_reasons"].items()):
            o.sample("tokenrouter_step_launches_total", n, model=w, reason=reason)
        o.declare("tokenrouter_frames_dropped_total", "counter",
                  "Frames dropped: invalid (failed validation), test_only (refused), error (handling raised).")
        for reason, n in sorted(s.get("frames_dropped", {}).items()):
            o.sample("tokenrouter_frames_dropped_total", n, model=w, reason=reason)
        o.histogram("tokenrouter_step_seconds", s["step_s"], "Wall time of one step.", model=w)
        o.histogram("tokenrouter_batch_size", s["batch_size"], "Requests per step.", model=w)
        o.histogram("tokenrouter_queue_wait_seconds", s["queue_wait_s"],
                    "Time a ready request waited before its step.", model=w)
    o.declare("tokenrouter_requests_total", "counter", "Requests ended, by finish reason.")
    for reason, n in sorted(frontend.get("finished", {}).items()):
        o.sample("tokenrouter_requests_total", n, reason=reason)
    o.declare("tokenrouter_requests_running", "gauge", "Requests in flight.")
    o.sample("tokenrouter_requests_running", frontend.get("running", 0))
    o.declare("tokenrouter_requests_queued", "gauge", "Requests waiting for KV capacity at the frontend.")
    o.sample("tokenrouter_requests_queued", frontend.get("queued", 0))
    o.declare("tokenrouter_subserver_up", "gauge",
              "1 when the subserver is alive (heartbeats arrive) and answered this scrape.")
    up = frontend.get("up", {})
    for w in frontend.get("writers", []):
        o.sample("tokenrouter_subserver_up", 1 if up.get(w, True) and w in subservers else 0, model=w)
    o.declare("tokenrouter_subserver_restarts_total", "counter", "Times the subserver's process was restarted.")
    for w, n in sorted(frontend.get("restarts", {}).items()):
        o.sample("tokenrouter_subserver_restarts_total", n, model=w)
    o.declare("tokenrouter_frames_dropped_total", "counter",
              "Frames dropped: invalid (failed validation), test_only (refused), error (handling raised).")
    for reason, n in sorted(frontend.get("frames_dropped", {}).items()):
        o.sample("tokenrouter_frames_dropped_total", n, model="frontend", reason=reason)
    http = frontend.get("http")
    if http:
        o.declare("tokenrouter_http_requests_running", "gauge", "HTTP requests holding an admission slot.")
        o.sample("tokenrouter_http_requests_running", http["running"])
        o.declare("tokenrouter_http_requests_waiting", "gauge", "HTTP requests waiting for a slot.")
        o.sample("tokenrouter_http_requests_waiting", http["waiting"])
        o.declare("tokenrouter_http_requests_refused_total", "counter", "HTTP requests refused with 503 (queue full).")
        o.sample("tokenrouter_http_requests_refused_total", http["refused"])
    return "\n".join(o.lines) + "\n"
