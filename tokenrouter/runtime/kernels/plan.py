"""The measured choice of kernel per weight shape and row count, for every CPU float32 or
quantised model.

Decode at batch 1 streams every weight once per step, so the smallest format wins there;
at many rows the product becomes compute-bound and oneDNN's float32 kernel can win over the
int4 kernel's unpacking. Where the crossing lies differs from host to host (`bench_linear.py`),
so it is never fixed in code: at first load every matrix shape is timed, one pass over all
the model's matrices of that shape so the weights stream from memory as in a real step (a
float kernel of a quantised model over enough of them to stream, `FLOAT_MEASURE_BYTES`, its
time scaled to all: their float copies would otherwise take gigabytes),
for each kernel that computes the matrix's exact values and each row bucket (1, 2, 4, ...
64), kernels interleaved within each round so load hits all alike, best of the rounds.

A quantised model's shapes then run on ONE kernel at every row count, and only on a kernel
that passes `row_invariant`: kernels round differently, and with bfloat16 activations a
one-ulp difference in a layer's input grows, measured on SmolLM2, into 0.25 in the logits,
enough to change a greedy token or a routing decision. One kernel that computes each row
independently of its neighbours is what keeps a request's tokens the same at any
concurrency (with `attention.short_shape` for attention). The kernel with the least mean
slowdown over the decode row counts (1-16) wins.

A float32 model (`quant = none`) is not bit-invariant to begin with (its kernels round
differently at different row counts; the float32 engine keeps a request's logits within
5e-5 at any concurrency), so its plan takes the fastest kernel per row bucket
(`per_rows`), preferring a kernel on the plain weight within `FLOAT_MARGIN` of oneDNN's
so that no reordered copy is held where it buys nothing. Measured on two hosts, the
winner differs: an AMD EPYC ran one or two rows fastest on MKL's `W @ x.T`, an Intel Xeon
ran them 2.8x slower there than on `F.linear` (`bench_linear.py`), which is why nothing here
is fixed in code. Matrices too small for timing to mean anything (`MEASURE_MIN_BYTES`
per shape, the tests' tiny models) run `F.linear` unmeasured, the same in every process.

The plan is cached under the cache root (`kernel-plans/`), keyed by the host (`host_key`:
CPU model and flags, CPU count, torch version, threads), the model, its format and the C
kernels' sources, one entry per matrix shape and format (a new head format adds its shape;
the others are not measured again); `tokenrouter models --measure-kernels` measures again. Processes that start
together (a server's subservers) take one lock to measure (`cache.locked`): one measures at a
time, and a process whose plan another has just measured reads it, so they neither time each
other's load nor end up with different plans. The kernels themselves, and what each computes,
are in `linear.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch

from tokenrouter.runtime.cache import cache_root, locked, write_json
from tokenrouter.runtime.host import cpu_flags, cpu_model
from tokenrouter.runtime.kernels.build import source_hash
from tokenrouter.runtime.kernels.linear import INT_KERNELS, PLAIN_KERNELS, PlannedLinear

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
PLAN_VERSION = 5  # 2: one row-invariant kernel per shape; 3: `linear`, float32 models' plans; 4: int4dp/amx;
# 5: int4avx2, a rescored head's own key
MEASURE_MIN_BYTES = 4 << 20  # a float shape whose matrices hold less runs `linear` unmeasured

log = logging.getLogger(__name__)


def fixed_plan(kernel: str) -> list[tuple[int, str]]:
    """A plan that runs every row count on one kernel (tests, and forcing a path)."""
    return [(ROW_BUCKETS[-1], kernel)]


# ------------------------------------------------------------------ measurement

def host_key(threads: int | None = None) -> dict:
    """What a measured plan depends on besides the model: the CPU, torch, the thread count."""
    return {"cpu": cpu_model(), "flags": hashlib.sha256(cpu_flags().encode()).hexdigest()[:12],
            "torch": torch.__version__, "threads": threads or torch.get_num_threads(), "cpus": os.cpu_count()}


def row_invariant(lin: PlannedLinear, kernel: str, buckets=ROW_BUCKETS) -> bool:
    """Whether `kernel` computes each row of a product the same, bit for bit, whatever
    the number of rows beside it. Measured, not assumed: on this host torch's int4 and
    int8 kernels are, oneDNN is not for a [576, 1536] matrix at one row, and MKL's
    `W @ x.T` is not below 16 rows."""
    x = torch.randn(buckets[-1], lin.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = lin.run(kernel, x)
        return all(torch.equal(lin.run(kernel, x[:m]), full[:m]) for m in buckets[:-1])


def measure(linears: list[PlannedLinear], rounds: int = 2, buckets=ROW_BUCKETS,
            progress=None, per_rows: bool = False) -> dict[str, list[tuple[int, str]]]:
    """{shape key: plan}, each shape's candidates timed by one pass over all its matrices
    per kernel and row bucket (see the module docstring). By default one kernel per shape
    (`fixed_plan`): among the candidates that pass `row_invariant`, the one with the least
    mean slowdown over the decode buckets (`DECODE_ROWS`). With `per_rows` (float32 models),
    the fastest kernel per bucket (`per_rows_plan`), and shapes under `MEASURE_MIN_BYTES`
    on `linear` untimed. Timings are kept in `last_timings`."""
    groups = _by_shape(linears)
    progress = progress or log.info  # one line a shape: a first load measures for seconds to minutes
    plans: dict[str, list[tuple[int, str]]] = {}
    timings: dict[str, dict[str, dict[int, float]]] = {}
    for gi, (key, group) in enumerate(groups.items()):
        if per_rows and sum(lin.shape[0] * lin.shape[1] * 4 for lin in group) < MEASURE_MIN_BYTES:
            plans[key] = fixed_plan("linear")  # timings this small are noise: the same in every process
            continue
        if progress:
            progress(f"measuring kernels for {key} ({gi + 1}/{len(groups)}, {len(group)} matrices)")
        kernels = [k for k in _candidates(group) if k in group[0].measurable()]
        # a float kernel is timed on enough of the shape's matrices to stream from memory
        # (`FLOAT_MEASURE_BYTES`) and its time scaled to the whole shape: a quantised model's
        # float copies of every matrix would take gigabytes (3 GB for a 1.5B model's gate/up)
        timed = {k: group if k in INT_KERNELS else _float_share(group) for k in kernels}
        for k in kernels:
            for lin in timed[k]:
                lin.build([k])
        if not per_rows:
            # a kernel whose rows depend on their neighbours would make a request's tokens depend
            # on its batch; only if no candidate is invariant (no oneDNN, float MKL only) run anyway
            kernels = [k for k in kernels if row_invariant(group[0], k, buckets)] or kernels
        k_in = group[0].shape[1]
        best = {k: {} for k in kernels}
        live = list(kernels)
        with torch.inference_mode():
            for rows in buckets:
                x = torch.randn(rows, k_in)
                for r in range(rounds + 1):  # round 0 warms up
                    for k in live:
                        t0 = time.perf_counter()
                        for lin in timed[k]:
                            lin.run(k, x)
                        dt = (time.perf_counter() - t0) * len(group) / len(timed[k])
                        if r:
                            best[k][rows] = min(best[k].get(rows, float("inf")), dt)
                # past the decode buckets, a kernel 3x slower than the best is not timed at
                # larger row counts (time grows with rows for all of them): this bounds the
                # first load's cost
                if rows >= DECODE_ROWS:
                    fastest = min(best[k][rows] for k in live)
                    live = [k for k in live if best[k][rows] <= 3 * fastest]
        if per_rows:
            plans[key] = per_rows_plan(best, buckets)
        else:
            plans[key] = fixed_plan(pick_kernel(best, [b for b in buckets if b <= DECODE_ROWS]))
        timings[key] = {k: {str(r): v * 1e3 for r, v in t.items()} for k, t in best.items()}
    measure.last_timings = timings
    return plans


measure.last_timings = {}


FLOAT_MEASURE_BYTES = 256 << 20  # float32 bytes a float kernel is timed on, at least (or all a shape has)


def _float_share(group: list[PlannedLinear]) -> list[PlannedLinear]:
    """The first of a shape's matrices whose float32 copies hold `FLOAT_MEASURE_BYTES` (all
    of them if they hold less): what a float kernel's timing runs on."""
    each = group[0].shape[0] * group[0].shape[1] * 4
    return group[:max(1, min(len(group), -(-FLOAT_MEASURE_BYTES // each)))]


def _by_shape(linears: list[PlannedLinear]) -> dict[str, list[PlannedLinear]]:
    """The matrices grouped by the key a plan is chosen by (shape and format)."""
    groups: dict[str, list[PlannedLinear]] = {}
    for lin in linears:
        groups.setdefault(lin.key, []).append(lin)
    return groups


def _candidates(group: list[PlannedLinear]) -> list[str]:
    """The kernels every matrix of a shape can run: one plan serves them all, and whether the
    C int4 kernels take a matrix depends on its own scales, not only on its shape."""
    return [k for k in group[0].candidates() if all(k in lin.candidates() for lin in group[1:])]


DECODE_ROWS = 16  # the row counts a decode step sees; larger ones are prefill chunks
FLOAT_MARGIN = 1.10  # a kernel that needs its own copy of the matrix must win by 10% to earn it


# within FLOAT_MARGIN, the first of these wins: the C kernels before torch's int4 (which rounds
# scales, zeros and output to bfloat16); among them int4dp/int4amx first, as chosen on AVX-512
# BF16 hosts before int4avx2 existed, so those hosts' plans change only where it wins by 10%
PREFERRED = ("int4dp", "int4amx", "int4avx2", "int8avx2", "int4", "int8")


def pick_kernel(best: dict[str, dict[int, float]], rows: list[int]) -> str:
    """The kernel with the least mean slowdown against the fastest at each of `rows`; but a
    kernel within `FLOAT_MARGIN` of it wins by `PREFERRED`'s order: an integer kernel over a
    float one (which costs a float copy of the matrix), and `int4dp` over `int4` (it keeps
    scales and output unrounded: on SmolLM2 its greedy tokens agree with float32 at 99.9% of
    808 positions against 98.9%; `int4avx2` at 99.75-100%); on a loaded host a few percent is
    noise.

    One kernel for every row count, not the fastest per row count: two kernels compute a row
    to different roundings, and a plan that switched between them would make a request's
    tokens depend on how many others share its step."""
    fastest = {r: min(t[r] for t in best.values()) for r in rows}
    slowdown = {k: sum(t[r] / fastest[r] for r in rows) / len(rows) for k, t in best.items()}
    winner = min(slowdown, key=slowdown.get)
    return next((k for k in PREFERRED if k in slowdown and slowdown[k] <= FLOAT_MARGIN * slowdown[winner]), winner)


def per_rows_plan(best: dict[str, dict[int, float]], buckets) -> list[tuple[int, str]]:
    """A float32 model's plan: per row bucket the fastest kernel, except that a kernel on the
    plain weight (`PLAIN_KERNELS`) within `FLOAT_MARGIN` of the fastest wins (oneDNN's
    reordered copy doubles the matrix's memory); adjacent buckets on one kernel merge."""
    plan: list[tuple[int, str]] = []
    for rows in buckets:
        times = {k: t[rows] for k, t in best.items() if rows in t}
        fastest = min(times.values())
        plain = [k for k in PLAIN_KERNELS if k in times and times[k] <= FLOAT_MARGIN * fastest]
        kernel = min(plain or times, key=times.get)
        if plan and plan[-1][1] == kernel:
            plan[-1] = (rows, kernel)
        else:
            plan.append((rows, kernel))
    return plan


def plan_path(model_id: str, quant: str, act_dtype: torch.dtype, threads: int | None = None) -> str:
    """Where the plan of (model, format, host) is cached."""
    # the C kernels' source: a changed kernel is timed again
    key = json.dumps({"v": PLAN_VERSION, "model": model_id, "quant": quant, "act": str(act_dtype),
                      "host": host_key(threads), "csrc": source_hash()}, sort_keys=True)
    return os.path.join(cache_root(), "kernel-plans", hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


def choose(linears: list[PlannedLinear], plan: dict | str | None = None, cache_path: str | None = None,
           progress=None, per_rows: bool = False) -> dict:
    """Give every matrix its plan and drop what it no longer needs. `plan`: a kernel name
    (every matrix on it where it can run, else on its own integer kernel, else float32), a
    {shape key: plan} dict, or None to measure (`measure`, with `per_rows` for a float32
    model; read from / written to `cache_path` when given, under a lock so that processes
    starting together measure once). Returns the plans used."""
    if isinstance(plan, str):
        plans = {}
        for key, group in _by_shape(linears).items():
            # the named kernel where it runs, else the shape's own integer kernel, else float32
            cands = _candidates(group)
            k = plan if plan in cands else next((c for c in (*INT_KERNELS, "onednn") if c in cands), "mkl")
            plans[key] = fixed_plan(k)
    elif isinstance(plan, dict):
        plans = {k: [tuple(p) for p in v] for k, v in plan.items()}
    else:
        # the cache holds one entry per shape key: a model loaded with another head format adds
        # its head's shape to the file instead of measuring (and rewriting) every shape again
        plans, _ = _read_plans(cache_path)
        if any(lin.key not in plans for lin in linears):
            with locked(_lock_path(cache_path)):
                plans, timings = _read_plans(cache_path)  # another process may have measured meanwhile
                todo = [lin for lin in linears if lin.key not in plans]
                if todo:
                    log.info("measuring this host's kernel plan for %d matrices (once per host, model and format)",
                             len(todo))
                    plans.update(measure(todo, progress=progress, per_rows=per_rows))
                    timings.update(measure.last_timings)
                    if cache_path:
                        write_json(cache_path, {"host": host_key(), "plans": plans, "timings_ms": timings,
                                                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                 "load_avg": os.getloadavg()})
    for lin in linears:
        lin.finalize(plans[lin.key])
    return {lin.key: plans[lin.key] for lin in linears}


def _read_plans(cache_path: str | None) -> tuple[dict, dict]:
    """(plans, timings) cached at `cache_path`; empty where there is none or it is unreadable."""
    if not cache_path or not os.path.isfile(cache_path):
        return {}, {}
    try:
        with open(cache_path) as f:
            data = json.load(f)
        return {k: [tuple(p) for p in v] for k, v in data["plans"].items()}, data.get("timings_ms", {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, {}


def _lock_path(cache_path: str | None) -> str | None:
    """The one lock of the folder of cached plans (None without a path): one process measures
    at a time, whatever model it loads, so two subservers starting together neither time their
    kernels against each other's load nor measure the same model twice (the second reads what
    the first wrote)."""
    return os.path.join(os.path.dirname(cache_path), ".measuring.lock") if cache_path else None
