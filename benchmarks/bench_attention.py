"""Decode attention: torch's path (gather the blocks, two batched products around a softmax)
against the C kernel that reads the paged cache in place (`tokenrouter/runtime/kernels/bindings.py`).

SmolLM2-135M's attention geometry (30 layers, 9 query heads on 3 KV heads of 64, blocks of
16), a float32 cache of 1,100 blocks per head per layer (about 0.8 GB, so a step's K/V
stream from memory as in serving, not from cache), one decode token per request, requests'
blocks scattered through the cache. For each thread count and path (a configuration), every
(batch, context) shape runs once per round, rounds alternate between the configurations so
load hits all alike, and each configuration runs for at least `--seconds` (30) in all; the
median round and the spread (min-max) are reported in ms per step (all 30 layers).

    python benchmarks/bench_attention.py              # ~3 minutes: 1 and 2 threads, 30 s each
Writes bench_attention.{json,png} into --out (default bench-results/, a scratch folder git ignores;
the committed figures are benchmarks/results/bench_attention.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from tokenrouter.runtime.kernels import build
from tokenrouter.runtime.engine.attention import CacheGeometry, build_meta, paged_attention
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.kv_cache import KVCache
from tokenrouter.runtime.host import host_info

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 30, 9, 3, 64, 16, 1100
SHAPES = [(1, 128), (1, 512), (1, 2048), (8, 128), (8, 512), (8, 2048), (16, 256)]
PATHS = ("torch", "native")


def setup():
    cfg = ModelConfig(architecture="llama", vocab_size=32, hidden_size=HEADS * HEAD_DIM, intermediate_size=16,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=4096,
                      tie_word_embeddings=True, attention_bias=False, qk_norm=False)
    kv = KVCache(cfg, BLOCKS, BLOCK, "cpu", torch.float32)
    kv.kv.normal_(generator=torch.Generator().manual_seed(0))
    geo = CacheGeometry(BLOCK, BLOCKS, KV_HEADS, HEADS // KV_HEADS)
    order = random.Random(0).sample(range(BLOCKS), BLOCKS)
    metas = {}
    for b, n in SHAPES:
        nb = -(-n // BLOCK)
        tables = [order[i * nb:(i + 1) * nb] for i in range(b)]
        q = torch.randn(b, HEADS, HEAD_DIM)
        metas[(b, n)] = (q, {p: build_meta([1] * b, [n] * b, tables, [0] * b, geo, torch.float32, "cpu",
                                           native=p == "native") for p in PATHS})
    return kv, metas


def one_round(kv, metas, path: str) -> dict[str, float]:
    out = {}
    with torch.inference_mode():
        for (b, n), (q, by_path) in metas.items():
            t0 = time.perf_counter()
            for layer in range(LAYERS):
                paged_attention(q, kv, layer, by_path[path], HEAD_DIM ** -0.5)
            out[f"{b}x{n}"] = (time.perf_counter() - t0) * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--seconds", type=float, default=30.0, help="at least this long per configuration")
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args()
    why = build.available()
    if why:
        raise SystemExit(f"the C kernel is not available here: {why}")
    host = host_info()
    print(f"host: {host}", flush=True)
    kv, metas = setup()
    res = {"host": host, "geometry": {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                                      "block_size": BLOCK, "cache_blocks": BLOCKS},
           "seconds_per_config": a.seconds, "configs": {}}
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        rounds = {p: [] for p in PATHS}
        spent = {p: 0.0 for p in PATHS}
        for p in PATHS:
            one_round(kv, metas, p)  # warm-up
        while min(spent.values()) < a.seconds:
            for p in PATHS:
                t0 = time.perf_counter()
                rounds[p].append(one_round(kv, metas, p))
                spent[p] += time.perf_counter() - t0
        for p in PATHS:
            keys = rounds[p][0].keys()
            res["configs"][f"{p}, {threads} thread{'s' if threads > 1 else ''}"] = {
                "threads": threads, "path": p, "rounds": len(rounds[p]), "seconds": spent[p],
                "ms_per_step": {k: {"median": statistics.median(r[k] for r in rounds[p]),
                                    "min": min(r[k] for r in rounds[p]), "max": max(r[k] for r in rounds[p])}
                                for k in keys}}
        t, n = (res["configs"][f"{p}, {threads} thread{'s' if threads > 1 else ''}"]["ms_per_step"] for p in PATHS)
        for k in t:
            print(f"{threads} thread(s) {k:>8}: torch {t[k]['median']:7.2f} ms ({t[k]['min']:.2f}-{t[k]['max']:.2f})"
                  f"  C kernel {n[k]['median']:7.2f} ms ({n[k]['min']:.2f}-{n[k]['max']:.2f})"
                  f"  torch / C {t[k]['median'] / n[k]['median']:.2f}x", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_attention.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(a.out, "bench_attention.png"))
    print(f"wrote {a.out}/bench_attention.json and .png")
    return 0


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = [f"{b}x{n}" for b, n in SHAPES]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(res["configs"]))
    for i, (name, c) in enumerate(res["configs"].items()):
        med = [c["ms_per_step"][k]["median"] for k in keys]
        lo = [m - c["ms_per_step"][k]["min"] for k, m in zip(keys, med)]
        hi = [c["ms_per_step"][k]["max"] - m for k, m in zip(keys, med)]
        ax.bar([j + i * width for j in range(len(keys))], med, width, yerr=[lo, hi], label=name, capsize=2)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [k.replace("x", " req x ") for k in keys],
                  rotation=20, fontsize=8)
    ax.set_ylabel("ms per decode step (30 layers)")
    ax.set_yscale("log")
    ax.set_title(f"decode attention, SmolLM2 geometry: {res['host']['cpu']}, {res['host']['read_gb_per_s']:.1f} GB/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
