"""Measured run lengths of a real routing program, and how far the tuner's geometric
and phase-type models of them are from the measured throughput.

The runtime does not record routing traces, so the writers' visits are read off the
lockstep baseline (same compiled routers and engines, same tokens as the runtime; tested
in tests/runtime/baselines/test_baselines.py): every lockstep iteration steps each request once
on its current writer, so a request's sequence of writers, step by step, is exactly its
sequence of visits. A run length counts one writer's steps during one visit, the
triggering (possibly rewritten) step included, as `tuner.runlength` defines it.
"""

from __future__ import annotations

from itertools import groupby

from tokenrouter.runtime.baselines.lockstep import Lockstep
from tokenrouter.runtime.engine.sampler import SamplingParams


def runs_of(writers: list[str]) -> list[tuple[str, int]]:
    """[(writer, steps)] for consecutive steps by the same writer."""
    return [(w, sum(1 for _ in g)) for w, g in groupby(writers)]


def collect(program, prompts: list[list[int]], max_tokens: int, concurrency: int = 8,
            threads: int = 0) -> tuple[dict[str, list[int]], dict[str, list[int]], list]:
    """Generate greedily on the lockstep baseline; return (complete run lengths per
    writer, the request's last, truncated run per writer, outputs). A run cut off by the
    end of the request is not a complete visit and is kept apart."""
    seq: dict[str, list[str]] = {}

    class Recording(Lockstep):
        def _step(self, w, batch, outs):
            for r in batch:
                seq.setdefault(r.state.rid, []).append(w)
            return super()._step(w, batch, outs)

    ls = Recording(program, threads=threads, num_blocks=max(256, 4 * concurrency * (max_tokens // 16 + 4)))
    outs = ls.generate(prompts, SamplingParams(max_tokens=max_tokens), concurrency=concurrency)
    complete: dict[str, list[int]] = {}
    last: dict[str, list[int]] = {}
    for rid in sorted(seq, key=int):
        runs = runs_of(seq[rid])
        for w, k in runs[:-1]:
            complete.setdefault(w, []).append(k)
        w, k = runs[-1]
        last.setdefault(w, []).append(k)
    return complete, last, outs
