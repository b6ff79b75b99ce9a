"""Counters each subserver keeps, the frontend's request metrics, and `GET /metrics` in the
Prometheus text format (`prometheus_client`).

A subserver owns a `SubserverStats` (plain numbers, updated by its decode loop, sent as a
JSON snapshot: its process has no HTTP server); the frontend asks every subserver for one
(`wire.Stats`) and `render` turns them, with the frontend's own counters, into metric
families at scrape time (`SnapshotCollector`). The frontend's latency histograms and token
counters (`RequestMetrics`: time to first token, end to end, between tokens, queueing;
prompt and generated tokens) are `prometheus_client` metrics it observes as requests end.
Metric names are listed in docs/runtime.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram as PromHistogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

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
    reprefills: int = 0  # requests whose KV here was lost with a dead incarnation, prefilled again
    reprefill_tokens: int = 0  # the tokens of those re-prefills
    prefill_tokens: int = 0  # tokens fed to the engine, all kinds
    prefill_tokens_computed: int = 0  # of those, the tokens at prompt positions (what forks save)
    requests_finished: dict[str, int] = field(default_factory=dict)  # reason -> count
    phase_s: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    step_s: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    queue_wait_s: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    launch_reasons: dict[str, int] = field(default_factory=dict)
    step_threads: dict[str, int] = field(default_factory=dict)  # threads a step launched with -> steps
    frames_dropped: dict[str, int] = field(default_factory=dict)  # invalid | stale | unauthenticated | test_only | error

    def snapshot(self, **gauges: Any) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, Histogram)}
        out.update({k: v.to_dict() for k, v in self.__dict__.items() if isinstance(v, Histogram)})
        out.update(gauges)
        return out


# ------------------------------------------------------------------- the frontend's

class RequestMetrics:
    """The frontend's per-request metrics, in a registry of their own (one per frontend).
    The `_created` series prometheus_client adds to counters and histograms are left out
    (`disable_created_metrics`), as vLLM does."""

    def __init__(self):
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)

        def hist(name: str, doc: str, buckets) -> PromHistogram:
            return PromHistogram(name, doc, buckets=buckets, registry=self.registry)

        self.ttft = hist("tokenrouter_time_to_first_token_seconds",
                         "From a request's arrival at the frontend to its first token.", LATENCY_BUCKETS)
        self.e2e = hist("tokenrouter_e2e_request_latency_seconds",
                        "From a request's arrival at the frontend to its end.", LATENCY_BUCKETS)
        self.itl = hist("tokenrouter_inter_token_latency_seconds",
                        "Between two runs of tokens of one request reaching the frontend.", TOKEN_GAP_BUCKETS)
        self.queue = hist("tokenrouter_request_queue_time_seconds",
                          "From a request's arrival to its submission (waiting for KV capacity).", LATENCY_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def observe(self, arrived: float, submitted: float | None, token_times: list[float], ended: float,
                prompt_tokens: int, generated: int) -> None:
        """One ended request: its arrival, submission, the arrival of each run of its tokens, its end."""
        self.prompt_tokens += prompt_tokens if submitted is not None else 0
        self.generation_tokens += generated
        if submitted is not None:
            self.queue.observe(submitted - arrived)
        if token_times:
            self.ttft.observe(token_times[0] - arrived)
            for a, b in zip(token_times, token_times[1:]):
                self.itl.observe(b - a)
        self.e2e.observe(ended - arrived)


# ------------------------------------------------------------------- rendering

class SnapshotCollector:
    """A `prometheus_client` collector of the subservers' snapshots and the frontend's counters."""

    def __init__(self, subservers: dict[str, dict[str, Any]], frontend: dict[str, Any]):
        self.subservers, self.frontend = subservers, frontend

    def collect(self) -> Iterable:
        yield from _subserver_families(self.subservers)
        yield from _frontend_families(self.subservers, self.frontend)


SIMPLE = (  # (snapshot key, name, kind, help)
    ("tokens_written", "tokenrouter_tokens_written_total", "counter", "Tokens this writer committed."),
    ("tokens_rewritten", "tokenrouter_tokens_rewritten_total", "counter",
     "Tokens this writer sampled that were rewritten by the next writer."),
    ("steps", "tokenrouter_steps_total", "counter", "Engine steps run."),
    ("suffix_tokens_in", "tokenrouter_handoff_suffix_tokens_total", "counter",
     "Tokens received in handoffs (unseen suffixes only)."),
    ("reprefills", "tokenrouter_reprefills_total", "counter",
     "Requests prefilled again here because this writer's previous process died with their KV."),
    ("reprefill_tokens", "tokenrouter_reprefill_tokens_total", "counter", "Tokens of those re-prefills."),
    ("engine_computed_tokens", "tokenrouter_engine_computed_tokens_total", "counter",
     "Tokens the writer's engine computed, by its own count (vLLM's scheduler for a vLLM writer)."),
    ("prefill_tokens_computed", "tokenrouter_prefill_tokens_computed_total", "counter",
     "Prompt tokens this writer computed (the choices of an n > 1 request fork one prefill's KV)."),
    ("kv_forks", "tokenrouter_kv_forks_total", "counter", "Choices that forked another choice's prompt KV."),
    ("pending", "tokenrouter_pending_requests", "gauge", "Requests away at a peer, KV kept here."),
    ("ready", "tokenrouter_ready_requests", "gauge", "Requests ready to step here."),
    ("blocks_used", "tokenrouter_kv_blocks_used", "gauge", "KV cache blocks in use."),
    ("blocks_free", "tokenrouter_kv_blocks_free", "gauge", "KV cache blocks free."),
    ("threads", "tokenrouter_threads", "gauge",
     "CPU threads of this subserver's last step (torch.get_num_threads; by need where writers share the cores)."),
    ("batch_threshold", "tokenrouter_batch_threshold", "gauge", "Delayed-batching threshold B_i."),
    ("max_wait_s", "tokenrouter_max_wait_seconds", "gauge", "Longest a ready request waits for a batch to fill."),
)
DROPPED_HELP = ("Frames dropped: invalid (failed validation), stale (for or from another incarnation), unexpected "
                "(a ready out of place), unauthenticated (peers refused at the handshake), test_only (refused), "
                "error (handling raised).")


def _family(kind: str, name: str, help_: str, labels: list[str]):
    if kind == "counter":
        return CounterMetricFamily(name, help_, labels=labels)
    return GaugeMetricFamily(name, help_, labels=labels)


def _histogram(name: str, help_: str, snaps: dict[str, dict[str, Any]], key: str) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, help_, labels=["model"])
    for w, s in snaps.items():
        h, cum, buckets = s[key], 0, []
        for le, c in zip(h["buckets"], h["counts"]):
            cum += c
            buckets.append((repr(float(le)), cum))
        buckets.append(("+Inf", cum + h["counts"][-1]))
        fam.add_metric([w], buckets, h["sum"])
    return fam


def _subserver_families(subservers: dict[str, dict[str, Any]]) -> Iterable:
    snaps = dict(sorted(subservers.items()))
    for key, name, kind, help_ in SIMPLE:
        fam = _family(kind, name, help_, ["model"])
        for w, s in snaps.items():
            fam.add_metric([w], float(s.get(key, 0)))
        yield fam
    for key, name, help_ in (("handoffs_out", "tokenrouter_handoffs_out_total", "Requests this writer sent to a peer."),
                             ("handoffs_in", "tokenrouter_handoffs_in_total", "Requests this writer received from a peer.")):
        fam = CounterMetricFamily(name, help_, labels=["model", "peer"])
        for w, s in snaps.items():
            for peer, n in sorted(s[key].items()):
                fam.add_metric([w, peer], n)
        yield fam
    for key, name, label, help_ in (
            ("phase_s", "tokenrouter_step_phase_seconds_total", "phase",
             "Time spent in each part of a step (schedule, forward, sample, route, bookkeeping, messaging)."),
            ("launch_reasons", "tokenrouter_step_launches_total", "reason", "Why each step was launched (delayed batching)."),
            ("step_threads", "tokenrouter_step_threads_total", "threads",
             "Steps by the CPU threads they launched with (writers sharing the cores take them by need).")):
        fam = CounterMetricFamily(name, help_, labels=["model", label])
        for w, s in snaps.items():
            items = s[key].items() if key == "phase_s" else sorted(s.get(key, {}).items())
            for what, v in items:
                fam.add_metric([w, what], v)
        yield fam
    yield _histogram("tokenrouter_step_seconds", "Wall time of one step.", snaps, "step_s")
    yield _histogram("tokenrouter_batch_size", "Requests per step.", snaps, "batch_size")
    yield _histogram("tokenrouter_queue_wait_seconds", "Time a ready request waited before its step.", snaps,
                     "queue_wait_s")


def _frontend_families(subservers: dict[str, dict[str, Any]], frontend: dict[str, Any]) -> Iterable:
    dropped = CounterMetricFamily("tokenrouter_frames_dropped_total", DROPPED_HELP, labels=["model", "reason"])
    for w, s in sorted(subservers.items()):
        for reason, n in sorted(s.get("frames_dropped", {}).items()):
            dropped.add_metric([w, reason], n)
    for reason, n in sorted(frontend.get("frames_dropped", {}).items()):
        dropped.add_metric(["frontend", reason], n)
    yield dropped
    fam = CounterMetricFamily("tokenrouter_requests_total", "Requests ended, by finish reason.", labels=["reason"])
    for reason, n in sorted(frontend.get("finished", {}).items()):
        fam.add_metric([reason], n)
    yield fam
    yield GaugeMetricFamily("tokenrouter_requests_running", "Requests in flight.", value=frontend.get("running", 0))
    yield GaugeMetricFamily("tokenrouter_requests_queued", "Requests waiting for KV capacity at the frontend.",
                            value=frontend.get("queued", 0))
    up, fam = frontend.get("up", {}), GaugeMetricFamily(
        "tokenrouter_subserver_up", "1 when the subserver is alive (heartbeats arrive) and answered this scrape.",
        labels=["model"])
    for w in frontend.get("writers", []):
        fam.add_metric([w], 1 if up.get(w, True) and w in subservers else 0)
    yield fam
    fam = CounterMetricFamily("tokenrouter_subserver_restarts_total", "Times the subserver's process was restarted.",
                              labels=["model"])
    for w, n in sorted(frontend.get("restarts", {}).items()):
        fam.add_metric([w], n)
    yield fam
    for key, name, help_ in (
            ("heartbeat", "tokenrouter_subserver_heartbeat_gap_max_seconds",
             "The longest gap between two heartbeats of the subserver the frontend read (their jitter)."),
            ("progress", "tokenrouter_subserver_progress_gap_max_seconds",
             "The longest gap between two signs of progress of the subserver's decoding loop (the stall window "
             "must outlast it).")):
        fam = GaugeMetricFamily(name, help_, labels=["model"])
        for w, g in sorted(frontend.get("gaps", {}).items()):
            fam.add_metric([w], round(g[key], 3))
        yield fam
    fam = CounterMetricFamily("tokenrouter_requests_resumed_total",
                              "Requests lost with a dead subserver and resumed at this writer from the frontend's tokens.",
                              labels=["model"])
    for w, n in sorted(frontend.get("resumed", {}).items()):
        fam.add_metric([w], n)
    yield fam
    yield CounterMetricFamily("tokenrouter_frontend_loop_restarts_total",
                              "Times a loop of the frontend died and was started again.",
                              value=frontend.get("loop_restarts", 0))
    for key, name, help_ in (("prompt_tokens", "tokenrouter_prompt_tokens_total", "Prompt tokens of submitted requests."),
                             ("generation_tokens", "tokenrouter_generation_tokens_total",
                              "Output tokens of ended requests (what their clients received).")):
        if key in frontend:
            yield CounterMetricFamily(name, help_, value=frontend[key])
    http = frontend.get("http")
    if http:
        yield GaugeMetricFamily("tokenrouter_http_requests_running", "HTTP requests holding an admission slot.",
                                value=http["running"])
        yield GaugeMetricFamily("tokenrouter_http_requests_waiting", "HTTP requests waiting for a slot.",
                                value=http["waiting"])
        yield CounterMetricFamily("tokenrouter_http_requests_refused_total",
                                  "HTTP requests refused with 503 (queue full).", value=http["refused"])
        yield GaugeMetricFamily("tokenrouter_http_connections_open", "HTTP connections open.",
                                value=http.get("connections_open", 0))
        fam = CounterMetricFamily("tokenrouter_http_connections_closed_total",
                                  "HTTP connections closed by the server: header_timeout, body_timeout, evicted (at "
                                  "the cap, for a new one), refused (at the cap, every one busy).", labels=["reason"])
        for why, n in sorted(http.get("connections_closed", {}).items()):
            fam.add_metric([why], n)
        yield fam


def render(subservers: dict[str, dict[str, Any]], frontend: dict[str, Any],
           requests: RequestMetrics | None = None) -> str:
    """The Prometheus text exposition of every subserver snapshot, the frontend's counters
    and its request metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(subservers, frontend))
    text = generate_latest(registry)
    if requests is not None:
        text += generate_latest(requests.registry)
    return text.decode()
