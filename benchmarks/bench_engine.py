"""Engine speed, measured side by side in one run (never in a timed test).

1. Greedy generation, our engine against a plain `transformers` loop with its KV cache, on the
   same weights (the embedded SmolLM2-135M-Instruct, float32), 32-token prompts, decode
   ms/step and tokens/s at several batch sizes; then prefill time at a few shapes, 2 threads.
   Ours and theirs alternate round by round so the machine's noise (other processes on the
   2 cores) hits both alike; the best round counts.
2. Decode step time against batch size (1..64) at a fixed context, for the default pair
   (smollm2-135m, smollm2-135m-small) and the benchmark pair (bench-large, bench-small).
3. Decode step time against context length for the large models.
4. `torch.compile` (inductor, static shapes) of the decode forward against eager, at a few
   (batch, context) buckets: whether compiled buckets pay off on this CPU.

5. With `--quant`: the quantised weight formats (none, native, int4, int8) against llama.cpp
   on the same GGUF file, batches 1/4/8/16, 2 threads (`bench_quant.py`, which it runs).

    python benchmarks/bench_engine.py            # full (~10-20 min on 2 busy cores)
    python benchmarks/bench_engine.py --quick    # fewer sizes and steps (~3-5 min)
    python benchmarks/bench_engine.py --quant    # only section 5 (bench_quant.json/png)
Writes bench_engine.json and bench_engine.png (and, unless --no-compile,
bench_engine_compile.json) into --out (default bench-results/, a scratch folder git ignores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.host import host_info
from tokenrouter.runtime.loader import load_model

HERE = os.path.dirname(os.path.abspath(__file__))


def hf_model(m):
    """The `transformers` model of a loaded checkpoint, on the same float32 weights."""
    import transformers as tf
    raw = dict(m.raw_config)
    arch = raw.pop("architectures", ["LlamaForCausalLM"])[0]
    cfg = tf.AutoConfig.for_model(raw.pop("model_type"), **raw)
    model = getattr(tf, arch)(cfg)
    missing, unexpected = model.load_state_dict(m.weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.float().eval()


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch * 1000 + length)
    return torch.randint(100, vocab - 1, (batch, length), generator=g).tolist()


def ours_decode(eng: Engine, batch: int, ctx: int, steps: int) -> float:
    """Mean seconds per greedy decode step after a prefill of `ctx` tokens per request."""
    ps = prompts(batch, ctx, eng.config.vocab_size)
    out = eng.step([(("b", i), p) for i, p in enumerate(ps)])
    nxt = out.logits.argmax(-1).tolist()
    out = eng.step([(("b", i), [t]) for i, t in enumerate(nxt)])  # warm-up step
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = out.logits.argmax(-1).tolist()
        out = eng.step([(("b", i), [t]) for i, t in enumerate(nxt)])
    dt = (time.perf_counter() - t0) / steps
    for i in range(batch):
        eng.free(("b", i))
    assert eng.blocks_used == 0
    return dt


@torch.inference_mode()
def hf_decode(model, batch: int, ctx: int, steps: int, vocab: int) -> float:
    ids = torch.tensor(prompts(batch, ctx, vocab))
    out = model(ids, use_cache=True)
    cache = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    out = model(nxt, past_key_values=cache, use_cache=True)
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
    return (time.perf_counter() - t0) / steps


def bench_vs_transformers(name: str, batches: list[int], steps: int, rounds: int, threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    m = load_model(name)
    eng = Engine(m.config, m.weights, EngineOptions(max_model_len=1024))
    ref = hf_model(m)
    rows = []
    for b in batches:
        ours, theirs = [], []
        for _ in range(rounds):
            ours.append(ours_decode(eng, b, 32, steps))
            theirs.append(hf_decode(ref, b, 32, steps, m.config.vocab_size))
        row = {"model": name, "threads": threads, "batch": b, "ours_ms": min(ours) * 1e3, "hf_ms": min(theirs) * 1e3,
               "ours_tok_s": b / min(ours), "hf_tok_s": b / min(theirs), "speedup": min(theirs) / min(ours)}
        print(f"[vs transformers] {name} threads={threads} B={b}: ours {row['ours_ms']:.1f} ms/step ({row['ours_tok_s']:.1f} tok/s)"
              f"  transformers {row['hf_ms']:.1f} ms/step ({row['hf_tok_s']:.1f} tok/s)  x{row['speedup']:.2f}")
        rows.append(row)
    return rows


def bench_prefill_vs_transformers(name: str, shapes: list[tuple[int, int]], rounds: int, threads: int) -> list[dict]:
    """Prefill time (one forward over batch x length prompt tokens), ours and transformers'
    alternating, best round."""
    torch.set_num_threads(threads)
    m = load_model(name)
    eng = Engine(m.config, m.weights, EngineOptions(max_model_len=max(n for _, n in shapes) + 8))
    ref = hf_model(m)
    rows = []
    for b, n in shapes:
        ps = prompts(b, n, m.config.vocab_size)
        ours, theirs = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            eng.step([(("p", i), p) for i, p in enumerate(ps)])
            ours.append(time.perf_counter() - t0)
            for i in range(b):
                eng.free(("p", i))
            with torch.inference_mode():
                t0 = time.perf_counter()
                ref(torch.tensor(ps), use_cache=True)
                theirs.append(time.perf_counter() - t0)
        row = {"model": name, "threads": threads, "batch": b, "tokens": n, "ours_ms": min(ours) * 1e3,
               "hf_ms": min(theirs) * 1e3, "ours_tok_s": b * n / min(ours), "speedup": min(theirs) / min(ours)}
        print(f"[prefill vs transformers] {name} threads={threads} {b}x{n}: ours {row['ours_ms']:.0f} ms "
              f"({row['ours_tok_s']:.0f} tok/s)  transformers {row['hf_ms']:.0f} ms  x{row['speedup']:.2f}")
        rows.append(row)
    return rows


def bench_batch_and_context(names: list[str], batches: list[int], contexts: list[int], steps: int,
                            rounds: int) -> tuple[list[dict], list[dict]]:
    engines = {}
    for n in names:
        m = load_model(n)
        need = max(max(batches) * -(-(64 + steps + 8) // 16), 16 * -(-(max(contexts) + steps + 8) // 16))
        engines[n] = Engine(m.config, m.weights, EngineOptions(max_model_len=max(contexts) + 64, num_blocks=need + 16))
    by_batch, by_ctx = [], []
    for b in batches:  # interleave the models within each size so noise hits all alike
        best = {n: min(ours_decode(engines[n], b, 64, steps) for _ in range(rounds)) for n in names}
        for n in names:
            by_batch.append({"model": n, "batch": b, "ctx": 64, "step_ms": best[n] * 1e3})
        print(f"[batch] B={b}: " + "  ".join(f"{n} {best[n] * 1e3:.1f} ms" for n in names))
    for ctx in contexts:
        for b in (1, 16):
            best = {n: min(ours_decode(engines[n], b, ctx, steps) for _ in range(rounds)) for n in names
                    if "large" in n or n == "smollm2-135m"}
            for n, v in best.items():
                by_ctx.append({"model": n, "batch": b, "ctx": ctx, "step_ms": v * 1e3})
            print(f"[context] ctx={ctx} B={b}: " + "  ".join(f"{n} {v * 1e3:.1f} ms" for n, v in best.items()))
    return by_batch, by_ctx


def bench_compile(name: str, buckets: list[tuple[int, int]], steps: int) -> list[dict]:
    """Eager vs inductor-compiled decode forward at fixed (batch, context) shapes."""
    from tokenrouter.runtime.engine.attention import AttnGroup, AttnMeta, build_meta
    m = load_model(name)
    eng = Engine(m.config, m.weights, EngineOptions(max_model_len=1024))
    model = eng.model

    def fwd(ids, pos, slot_mapping, rows, kv_blocks, kv_rows, mask, last):
        """Plain tensors in (no metadata object), so dynamo can trace the whole step."""
        meta = AttnMeta(slot_mapping, [AttnGroup(rows, kv_blocks, kv_rows, mask, None, None)], ids.shape[0])
        h, _ = model.forward(ids, pos, meta, eng.kv, last)
        return model.logits(h)

    compiled = torch.compile(fwd, dynamic=False)
    rows = []
    for b, ctx in buckets:
        for i, p in enumerate(prompts(b, ctx, m.config.vocab_size)):
            eng.step([(i, p)])
        tables = [eng.alloc.block_table(i) for i in range(b)]
        slots = [eng.alloc.append(i, [5]).slots[0] for i in range(b)]
        meta = build_meta([1] * b, [ctx + 1] * b, tables, slots, eng.geometry, eng.dtype, eng.device)
        grp = meta.groups[0]
        assert grp.dest is None
        args = (torch.full((b,), 5), torch.full((b,), ctx), meta.slot_mapping, grp.rows, grp.kv_blocks, grp.kv_rows, grp.mask,
                torch.arange(b))
        with torch.inference_mode():
            t0 = time.perf_counter()
            want = compiled(*args)
            compile_s = time.perf_counter() - t0
            got = fwd(*args)
            res = {}
            for label, f in (("eager", fwd), ("compiled", compiled), ("eager2", fwd), ("compiled2", compiled)):
                t0 = time.perf_counter()
                for _ in range(steps):
                    f(*args)
                res[label] = (time.perf_counter() - t0) / steps
        eager, comp = min(res["eager"], res["eager2"]), min(res["compiled"], res["compiled2"])
        rows.append({"model": name, "batch": b, "ctx": ctx, "eager_ms": eager * 1e3, "compiled_ms": comp * 1e3,
                     "compile_s": compile_s, "max_abs_diff": float((want - got).abs().max())})
        print(f"[compile] {name} B={b} ctx={ctx}: eager {eager * 1e3:.1f} ms  compiled {comp * 1e3:.1f} ms  "
              f"(compile {compile_s:.0f} s, max |diff| {rows[-1]['max_abs_diff']:.2e})")
        for i in range(b):
            eng.free(i)
    return rows


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    vs = res["vs_transformers"]
    x = range(len(vs))
    ax[0].bar([i - 0.2 for i in x], [r["ours_tok_s"] for r in vs], 0.4, label="tokenrouter engine")
    ax[0].bar([i + 0.2 for i in x], [r["hf_tok_s"] for r in vs], 0.4, label="transformers")
    ax[0].set_xticks(list(x), [f"B={r['batch']}\n{r['threads']} thr" for r in vs])
    ax[0].set_ylabel("decode tokens/s (fp32, SmolLM2-135M)")
    ax[0].legend()
    for n in sorted({r["model"] for r in res["by_batch"]}):
        rows = [r for r in res["by_batch"] if r["model"] == n]
        ax[1].plot([r["batch"] for r in rows], [r["step_ms"] for r in rows], "o-", label=n)
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("batch size (context 64)")
    ax[1].set_ylabel("decode step ms")
    ax[1].legend()
    for key in sorted({(r["model"], r["batch"]) for r in res["by_ctx"]}):
        rows = [r for r in res["by_ctx"] if (r["model"], r["batch"]) == key]
        ax[2].plot([r["ctx"] for r in rows], [r["step_ms"] for r in rows], "o-", label=f"{key[0]} B={key[1]}")
    ax[2].set_xscale("log", base=2)
    ax[2].set_xlabel("context length")
    ax[2].set_ylabel("decode step ms")
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparison")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the step-time sections (the comparison runs at 1 and 2)")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--quant", action="store_true",
                    help="only the quantised formats against llama.cpp (bench_quant.py; takes its flags after --)")
    a, rest = ap.parse_known_args()
    if a.quant:
        import subprocess
        import sys
        cmd = [sys.executable, os.path.join(HERE, "bench_quant.py"), "--out", a.out] + \
            (["--quick"] if a.quick else []) + [x for x in rest if x != "--"]
        return subprocess.call(cmd)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    q = a.quick
    steps, rounds = (8, 2) if q else (24, 3)
    res = {"machine": {**host_info(), "torch": torch.__version__, "threads": a.threads,
                       "platform": platform.platform()},
           "quick": q, "vs_transformers": []}
    for threads in (1, 2):
        res["vs_transformers"] += bench_vs_transformers("smollm2-135m", [1, 16] if q else [1, 4, 16, 64],
                                                        steps, rounds, threads)
    res["prefill_vs_transformers"] = bench_prefill_vs_transformers(
        "smollm2-135m", [(1, 512), (16, 128)] if q else [(1, 512), (1, 2048), (16, 128)], rounds, 2)
    torch.set_num_threads(a.threads)
    res["by_batch"], res["by_ctx"] = bench_batch_and_context(
        ["smollm2-135m", "smollm2-135m-small", "bench-large", "bench-small"],
        [1, 4, 16, 64] if q else [1, 2, 4, 8, 16, 32, 64], [64, 512] if q else [64, 256, 1024], steps, rounds)
    os.makedirs(a.out, exist_ok=True)
    if not a.no_compile:  # its own file: a --no-compile run keeps the last compile measurement
        comp = bench_compile("smollm2-135m", [(1, 64)] if q else [(1, 64), (16, 64)], steps)
        with open(os.path.join(a.out, "bench_engine_compile.json"), "w") as f:
            json.dump({"machine": res["machine"], "compile": comp}, f, indent=1)
    res["machine"]["load_avg_end"] = os.getloadavg()
    with open(os.path.join(a.out, "bench_engine.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(a.out, "bench_engine.png"))
    print(f"wrote {a.out}/bench_engine.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
