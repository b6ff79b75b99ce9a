"""Running deployments that `runner.py` measures in turn.

`RuntimeDeployment` starts a routing program on the runtime's own subservers (an offline
`LLM`: `launch.open_runtime`) in a private asyncio loop and keeps it up for the whole
benchmark; `measure` submits the prompts through the frontend with at most N in flight,
timing each request from submit to its final event, and takes the subservers' counters
before and after (per-step breakdown, steps, batch sizes, launch reasons).
`LockstepDeployment` does the same for the in-process lockstep baseline, which has no
per-request timing (its `generate` returns when every request is done). Both take the
workload's `SamplingParams` as they are and give request i the route seed i.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.baselines.lockstep import Lockstep
from tokenrouter.runtime.frontend.frontend import Delta
from tokenrouter.runtime.offline import LLM


@dataclass
class Measurement:
    """One measured batch of requests on one configuration."""
    config: str
    concurrency: int
    wall_s: float
    tokens: int
    latencies_s: list[float] | None  # per request, None when not measurable
    written_by: dict[str, int]
    outputs: list[list[int]]
    batch_threshold: dict[str, int] = field(default_factory=dict)
    phase_s: dict[str, dict[str, float]] = field(default_factory=dict)  # writer -> phase -> seconds
    steps: dict[str, int] = field(default_factory=dict)
    batch_sum: dict[str, float] = field(default_factory=dict)  # sum of batch sizes over steps
    fed_tokens: dict[str, int] = field(default_factory=dict)  # tokens fed to the engine: prefills, extends, decodes
    launch_reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def _delta(after: dict, before: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


class RuntimeDeployment(LLM):
    """A routing program served by the runtime (an offline `LLM`), kept running across
    measurements."""

    def __init__(self, program, opts, timeout: float = 300.0):
        super().__init__(program, launch=opts, timeout=timeout)

    def configure(self, batch: dict[str, int] | None) -> None:
        for w, b in (batch or {}).items():
            self.call(self.frontend.configure(w, batch_threshold=int(b)))

    def measure(self, name: str, prompts: list[list[int]], sampling: SamplingParams, concurrency: int,
                batch: dict[str, int] | None = None) -> Measurement:
        self.configure(batch)
        before = self.stats(timeout=10.0)
        t0 = time.perf_counter()
        outs = self.call(self._timed_requests(prompts, sampling, concurrency))
        wall = time.perf_counter() - t0
        after = self.stats(timeout=10.0)
        errors = [e for _, _, _, e in outs if e]
        if errors:
            raise RuntimeError(f"{name}: {len(errors)} request(s) failed: {errors[0]}")
        m = Measurement(name, concurrency, wall, sum(len(t) for t, _, _, _ in outs), [lat for _, lat, _, _ in outs],
                        _sum_written([wb for _, _, wb, _ in outs]), [t for t, _, _, _ in outs])
        for w, a in after.items():
            b = before.get(w, {})
            m.phase_s[w] = _delta(a["phase_s"], b.get("phase_s", {}))
            m.steps[w] = a["steps"] - b.get("steps", 0)
            m.batch_sum[w] = a["batch_size"]["sum"] - b.get("batch_size", {}).get("sum", 0)
            m.fed_tokens[w] = a["prefill_tokens"] - b.get("prefill_tokens", 0)
            m.launch_reasons[w] = _delta(a["launch_reasons"], b.get("launch_reasons", {}))
            m.batch_threshold[w] = a["batch_threshold"]
            m.threads[w] = a["threads"]
        return m

    async def _timed_requests(self, prompts, sampling, concurrency):
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(i: int):
            async with sem:
                t0 = time.perf_counter()
                toks: list[int] = []
                final = None
                async for ev in self.frontend.generate(prompts[i], sampling, route_seed=i):
                    if isinstance(ev, Delta):
                        toks += ev.tokens
                    else:
                        final = ev
                err = final.error if final is not None and final.reason == "error" else None
                return toks, time.perf_counter() - t0, dict(final.written_by) if final else {}, err

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


class LockstepDeployment:
    """The lockstep baseline in this process (threads: the machine's cores)."""

    def __init__(self, program, threads: int, num_blocks: int | None):
        self.threads = threads
        self.ls = Lockstep(program, threads=threads, num_blocks=num_blocks)

    def measure(self, name: str, prompts: list[list[int]], sampling: SamplingParams, concurrency: int,
                batch: dict[str, int] | None = None) -> Measurement:
        torch.set_num_threads(self.threads)
        ls = self.ls
        ph0, it0 = dict(ls.phase_s), ls.iterations
        t0 = time.perf_counter()
        outs = ls.generate(prompts, sampling, concurrency=concurrency, route_seeds=list(range(len(prompts))))
        wall = time.perf_counter() - t0
        m = Measurement(name, concurrency, wall, sum(len(o.token_ids) for o in outs), None,
                        _sum_written([o.tokens_by_model for o in outs]), [list(o.token_ids) for o in outs])
        m.phase_s["all"] = _delta(ls.phase_s, ph0)
        m.steps["all"] = ls.iterations - it0
        m.threads["all"] = self.threads
        return m

    def close(self) -> None:
        pass


def _sum_written(items: list[dict[str, int]]) -> dict[str, int]:
    tot: dict[str, int] = {}
    for wb in items:
        for k, v in wb.items():
            tot[k] = tot.get(k, 0) + v
    return tot
