"""Quantised weights against llama.cpp, side by side in one run on the same GGUF file.

The embedded SmolLM2-135M-Instruct Q4_1 GGUF by default, or any GGUF (`--model`: a path, or
a built-in name made from one, such as Qwen's Q4_K_M files), 2 threads everywhere, greedy,
32-token prompts and 128 new tokens per request (llama.cpp: `ignore_eos`, so both make
exactly as many), batches 1, 4, 8 and 16. Configurations:

- `none`: our engine on the file dequantised to float32 (the exact default);
- `native`: the file's own blocks, one row-invariant kernel per shape (torch's int4
  kernel or one of ours: 4-bit codes on int4avx2/int4dp/int4amx, Q5_0/Q8_0/Q6_K on
  int8avx2), chosen by the plan measured on this host at first load, the LM head as int4
  with its best candidates rescored from the file (`--head-quant` to change);
- `int4`, `int8`: the file's values quantised on load (int4: 4-bit codes as they are, the
  rest min/max per group of 32), read from the file's blocks;
- `native-torch-attention`, `native-unfused`, `native-per-call`, `native-f32kv`,
  `native-torch-int4`, `native-int4dp`, `native-int4amx`, `native-int4avx2`,
  `native-int4avx2-x8`, `native-file-head` (not run by default): `native` without the C decode-attention kernel,
  without the C element-wise ops between the matrix products (`fused_ops=False`), with the
  decode stack's layers as one call each (`decode_stack=False`), with a float32 KV cache, or
  with every matrix on torch's int4 kernel or on one of the C ones (`csrc/int4_matmul.c`:
  AVX-512 dot products, AMX tiles; `csrc/int4_avx2.c`: integer dot products, x at ~15 bits or,
  opt-in, int8) instead of the measured plan, or with the LM head on the file's own codes
  (`head_quant = native`: Q8_0/Q6_K on int8avx2, no rescoring) instead of int4, to measure
  what each gives;
- `llama.cpp`: upstream llama.cpp's server (the `xllamacpp` wheel, in its own process) with
  as many slots as concurrent requests, continuous batching, requests over loopback HTTP.
  The wheel is one build for every x86 CPU (AVX2); the JSON records each server's
  `system_info`;
- `llama.cpp-native` (with `--llama-server PATH`): the same server as a `llama-server` binary
  built on this host with `-DGGML_NATIVE=ON`, so it uses every instruction set the CPU has,
  as a user who builds llama.cpp from source would run it (`scripts/build-llama-server`
  builds it from the wheel's own source).

Configurations alternate within each round, batch by batch, so the shared machine's load
hits all alike; each runs whole waves of `batch` requests back to back for at least
`--min-s` seconds (30 by default) at each batch in each round; the best round counts, and
the load average is recorded with every figure. Each of ours records how long the load
and the engine's build took (`load_s`, `engine_build_s`: the build measures the kernel plan
on a model's first load, then reads it), and the JSON the bytes the model cache holds for
the model (`cache_mb`: the entry without weights, and the float checkpoint where `none`
made one). Tokens/s is end to end (prefill included)
over all requests of those waves; ms/step is the mean
decode step (ours: timed per step; llama.cpp: its own `predicted_per_token_ms`); ours also
time their matrix products alone at the batch's rows (`ms_matrices`, `matrices_ms`) and what
that streams (`matrices_gb_s`: the held matrices' bytes over that time, against the host's
read bandwidth: `read_gb_per_s` single-threaded as every figure's host line, and
`read_gb_per_s_threads` at the run's threads). RSS is measured per configuration in a fresh
process after loading and one step.

    python benchmarks/bench_quant.py            # 5 configurations x 4 batches x 3 rounds x 30 s: ~35 min
    python benchmarks/bench_quant.py --quick    # 1 round, batches 1 and 8, 3 s each
Writes bench_quant.{json,png} into --out (default bench-results/, a scratch folder git ignores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch

from tokenrouter.runtime.host import cpu_flags, host_info, load_average

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT, NEW = 32, 128
OURS = ("none", "native", "int4", "int8")
LLAMAS = ("llama.cpp", "llama.cpp-native")  # the wheel's server, and one built on this host
# `native` with one of the engine's C paths turned off, to measure what it gives
VARIANTS = {"native-torch-attention": {"attention": "torch"}, "native-unfused": {"fused_ops": False},
            "native-per-call": {"decode_stack": False},
            "native-f32kv": {"kv_dtype": "float32"},
            "native-torch-int4": {"kernel_plan": "int4"}, "native-int4dp": {"kernel_plan": "int4dp"},
            "native-int4amx": {"kernel_plan": "int4amx"}, "native-int4avx2": {"kernel_plan": "int4avx2"},
            "native-int4avx2-x8": {"kernel_plan": "int4avx2-x8"},
            "native-file-head": {"head_quant": "native"}}
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1000 + batch)
    return torch.randint(100, vocab - 1, (batch, PROMPT), generator=g).tolist()


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------ ours

def build_engine(quant: str, head_quant: str | None = None, model: str = "smollm2-135m", timing: dict | None = None):
    """(LoadedModel, Engine) of `model` in format `quant` (a variant: native with its options);
    the seconds the load and the engine's build took go into `timing`."""
    from tokenrouter.runtime.engine.engine import Engine
    from tokenrouter.runtime.loader import load_model
    variant = VARIANTS.get(quant, {})
    quant = "native" if variant else quant
    t0 = time.perf_counter()
    m = load_model(model, quant=quant)
    t1 = time.perf_counter()
    kw = {"head_quant": head_quant} if head_quant and quant != "none" and "head_quant" not in variant else {}
    eng = Engine(m.config, m.weights, m.engine_options(quant, max_model_len=PROMPT + NEW + 16, num_blocks=16 * 12 + 8,
                                                       **variant, **kw))
    if timing is not None:
        timing.update(load_s=t1 - t0, engine_build_s=time.perf_counter() - t1)
    return m, eng


def cache_mb(model: str) -> dict:
    """The MB the model cache holds for `model` (a GGUF): its entry without weights, and the
    float checkpoint if one was made (by `none`, here or before)."""
    from tokenrouter.runtime import cache
    from tokenrouter.runtime.loader.builtin.registry import gguf_entry
    from tokenrouter.runtime.loader.resolve import gguf_source
    source, out = gguf_source(model), {}
    for what, weights in (("without weights", False), ("float checkpoint", True)):
        slug, key, _ = gguf_entry(source, weights=weights)
        folder = cache.entry_path(slug, key)
        if os.path.isdir(folder):
            out[what] = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e6
    return out


def steady(wave, min_s: float) -> dict:
    """Waves of requests (`wave()`: {tokens, wall_s, ms_step}) back to back until `min_s`
    seconds have passed: tokens/s over all of them, the mean decode step, how many ran."""
    waves, t0 = [], time.perf_counter()
    while not waves or time.perf_counter() - t0 < min_s:
        waves.append(wave())
    tokens, wall = sum(w["tokens"] for w in waves), sum(w["wall_s"] for w in waves)
    return {"tok_s": tokens / wall, "ms_step": sum(w["ms_step"] for w in waves) / len(waves), "tokens": tokens,
            "wall_s": wall, "waves": len(waves), "load": os.getloadavg()[0]}


def ours_wave(eng, batch: int) -> dict:
    ps = prompts(batch, eng.config.vocab_size)
    t0 = time.perf_counter()
    out = eng.step([(i, p) for i, p in enumerate(ps)])
    t1 = time.perf_counter()
    for _ in range(NEW - 1):
        nxt = out.logits.argmax(-1).tolist()
        out = eng.step([(i, [t]) for i, t in enumerate(nxt)])
    t2 = time.perf_counter()
    for i in range(batch):
        eng.free(i)
    return {"tokens": batch * NEW, "wall_s": t2 - t0, "ms_step": (t2 - t1) / (NEW - 1) * 1e3}


def ours_run(eng, batch: int, min_s: float) -> dict:
    run = steady(lambda: ours_wave(eng, batch), min_s)
    ms = matrices_ms(eng, batch)
    nbytes = sum(lin.nbytes() for lin in eng.model.linears())
    return {**run, "ms_matrices": ms, "matrices_gb_s": nbytes / ms / 1e6 if ms else None}


def matrices_ms(eng, rows: int, passes: int = 5) -> float | None:
    """The step's matrix products alone at `rows` rows: every decoder matrix and the LM head on
    the kernels the plan chose, back to back (the weights stream from memory as in a step),
    best of `passes`. What is left of `ms_step` is attention, norms, casts and dispatch; and
    no step on these kernels can be faster than this. None for the float32 engine."""
    lins = eng.model.linears()
    if not lins:
        return None
    xs = [torch.randn(rows, lin.shape[1]) for lin in lins]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(passes):
            t0 = time.perf_counter()
            for lin, x in zip(lins, xs):
                lin(x)
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def threaded_read_gb_s(mb: int = 256, repeats: int = 5) -> float:
    """Read bandwidth at torch's thread count: the best of a few sums over a buffer far larger
    than the caches (host.py's figure is one thread's)."""
    a = torch.ones(mb * 2 ** 20 // 4)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return round(a.numel() * 4 / best / 1e9, 2)


def int4x_isa_or_none() -> str | None:
    """The instructions the integer int4 kernel runs on here (None: not built)."""
    from tokenrouter.runtime.kernels import bindings
    return None if bindings.int4x_problem() else bindings.int4x_isa()


def rss_child(quant: str, head_quant: str | None, threads: int, model: str) -> None:
    """RSS after loading and one prefill + decode step, at the run's thread count: the kernel
    plan (and attention choice) the run measured are cached per thread count, so the child
    reads them instead of measuring its own, which would build float copies of every matrix
    and leave glibc holding them (a 1-thread child reported 1,462 MB for native, 722 once cached)."""
    torch.set_num_threads(threads)
    timing: dict = {}
    _, eng = build_engine(quant, head_quant, model, timing)
    ps = prompts(1, eng.config.vocab_size)
    out = eng.step([(0, ps[0])])
    eng.step([(0, [int(out.logits.argmax())])])
    print(json.dumps({"rss_mb": rss_mb(), "plans": {k: v for k, v in eng.kernel_plans.items()}, **timing}))


# ------------------------------------------------------------------ llama.cpp

class LlamaCpp:
    """A llama.cpp server with `parallel` slots (`bench.llamacpp.LlamaCppServer`: the wheel's,
    or, given `binary`, a llama-server built on this host), and this benchmark's requests."""

    def __init__(self, gguf: str, parallel: int, threads: int, binary: str | None = None):
        # imported here, not at the top: the RSS children (`rss_child`) measure our engine alone
        from tokenrouter.bench.llamacpp import LlamaCppServer
        self.server = LlamaCppServer(gguf, parallel, threads, PROMPT + NEW + 16, binary=binary)
        self.url, self.build = self.server.url, self.server.build

    def _one(self, ids: list[int]) -> dict:
        body = json.dumps({"prompt": ids, "n_predict": NEW, "temperature": 0.0, "ignore_eos": True,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request(self.url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def wave(self, batch: int, vocab: int) -> dict:
        ps = prompts(batch, vocab)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(batch) as ex:
            outs = list(ex.map(self._one, ps))
        dt = time.perf_counter() - t0
        n = sum(o["timings"]["predicted_n"] for o in outs)
        ms = sum(o["timings"]["predicted_per_token_ms"] for o in outs) / len(outs)
        return {"tokens": n, "wall_s": dt, "ms_step": ms}

    def run(self, batch: int, vocab: int, min_s: float) -> dict:
        return steady(lambda: self.wave(batch, vocab), min_s)

    def rss(self) -> float:
        return rss_mb(self.server.proc.pid)

    def close(self) -> None:
        self.server.close()


# ------------------------------------------------------------------ the run

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--batches", default=None, help="comma-separated (default 1,4,8,16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default=",".join((*OURS, "llama.cpp")),
                    help="comma-separated subset of none,native,int4,int8,llama.cpp (default: these), "
                         f"llama.cpp-native (needs --llama-server) and the variants of native: {', '.join(VARIANTS)}")
    ap.add_argument("--min-s", type=float, default=None,
                    help="seconds each configuration runs at each batch in a round, in whole waves of requests "
                         "(default 30; --quick 3)")
    ap.add_argument("--llama-server", metavar="PATH",
                    help="a llama-server binary built on this host (-DGGML_NATIVE=ON), run as llama.cpp-native")
    ap.add_argument("--head-quant", choices=("int4", "int8", "none", "native"), default=None,
                    help="the LM head's format in the quantised configurations (default: the engine's)")
    ap.add_argument("--model", default="smollm2-135m",
                    help="a GGUF file, or a built-in model made from one (default: the embedded SmolLM2)")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.min_s = a.min_s if a.min_s is not None else 3.0 if a.quick else 30.0
    if a.min_s < 0:
        ap.error("--min-s must be >= 0")
    if a.rss_child:
        rss_child(a.rss_child, a.head_quant, a.threads, a.model)
        return 0
    from tokenrouter.runtime.loader.resolve import gguf_source
    torch.set_num_threads(a.threads)  # (before the host line: its threaded bandwidth runs at this count)
    batches = [int(b) for b in (a.batches or ("1,8" if a.quick else "1,4,8,16")).split(",")]
    configs = [c for c in a.configs.split(",") if c]
    bad = set(configs) - {*OURS, *VARIANTS, *LLAMAS}
    if bad:
        ap.error(f"unknown configs {sorted(bad)}")
    if "llama.cpp-native" in configs:
        from tokenrouter.bench.llamacpp import llama_server_problem
        why = llama_server_problem(a.llama_server)
        if why:
            ap.error(f"llama.cpp-native: {why}")
    gguf = gguf_source(a.model)
    if gguf is None:
        ap.error(f"--model {a.model}: not a GGUF file or a built-in model made from one")
    res = {"host": {**host_info(), "torch": torch.__version__, "read_gb_per_s_threads": threaded_read_gb_s(),
                    "flags": [f for f in FLAGS if f in cpu_flags().split()], "int4avx2_isa": int4x_isa_or_none(),
                    "llama_cpp_build": None, "llama_cpp_native_build": None},  # each server's system_info
           "threads": a.threads, "min_s": a.min_s, "gguf": os.path.basename(gguf), "prompt": PROMPT, "new_tokens": NEW,
           "head_quant": a.head_quant or "the engine's default", "rounds": a.rounds or (1 if a.quick else 3),
           "configs": configs, "runs": [], "rss_mb": {}, "plans": {}}
    print(f"host: {res['host']}", flush=True)
    run_rounds(res, gguf, batches, a)
    rss_of_formats(res, a)
    res["cache_mb"] = cache_mb(a.model)
    summarise(res, batches)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_quant.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, batches, os.path.join(a.out, "bench_quant.png"))
    print(f"wrote {a.out}/bench_quant.json and .png")
    return 0


def run_rounds(res: dict, gguf: str, batches: list[int], a) -> None:
    """Every configuration at every batch, alternating batch by batch, `res["rounds"]` times,
    into res["runs"] (and llama.cpp's RSS per slot count into res["rss_mb"])."""
    configs = res["configs"]
    ours = [c for c in (*OURS, *VARIANTS) if c in configs]
    engines, m = {}, None
    for q in ours:
        timing: dict = {}
        m, engines[q] = build_engine(q, a.head_quant, a.model, timing)
        for k, v in timing.items():
            res.setdefault(k, {})[q] = v
        print(f"loaded {q} in {timing['load_s']:.1f} s, built its engine in {timing['engine_build_s']:.1f} s",
              flush=True)
    vocab = 49152 if m is None else m.config.vocab_size
    servers = {(name, b): LlamaCpp(gguf, b, a.threads, a.llama_server if name == "llama.cpp-native" else None)
               for name in LLAMAS if name in configs for b in batches}
    for name, key in (("llama.cpp", "llama_cpp_build"), ("llama.cpp-native", "llama_cpp_native_build")):
        if name in configs:
            res["host"][key] = servers[(name, batches[0])].build
    try:
        for r in range(res["rounds"]):
            for b in batches:
                for name in configs:
                    run = servers[(name, b)].run(b, vocab, a.min_s) if name in LLAMAS else \
                        ours_run(engines[name], b, a.min_s)
                    res["runs"].append({"config": name, "batch": b, "round": r, **run})
                    floor = (f" ({run['ms_matrices']:.1f} in the matrices, {run['matrices_gb_s']:.1f} GB/s)"
                             if run.get("ms_matrices") else "")
                    print(f"round {r} B={b:2d} {name:22s} {run['tok_s']:7.1f} tok/s {run['ms_step']:7.1f} ms/step{floor} "
                          f"(load {run['load']:.1f})", flush=True)
        for (name, b), s in servers.items():
            res["rss_mb"][f"{name} (B={b} slots)"] = s.rss()
    finally:
        for s in servers.values():
            s.close()


def rss_of_formats(res: dict, a) -> None:
    """Each of our formats' RSS, alone in a fresh process (a variant is native's), and its plan."""
    for q in (q for q in OURS if q in res["configs"]):
        head = ["--head-quant", a.head_quant] if a.head_quant else []
        out = subprocess.run([sys.executable, __file__, "--rss-child", q, "--threads", str(a.threads), "--model",
                              a.model, *head], capture_output=True, text=True, timeout=1800)
        if out.returncode == 0:
            info = json.loads(out.stdout.strip().splitlines()[-1])
            res["rss_mb"][q] = info["rss_mb"]
            res["plans"][q] = info["plans"]
            res.setdefault("fresh_process_load_s", {})[q] = info["load_s"] + info["engine_build_s"]
        else:
            res["rss_mb"][q] = None
            print(out.stderr[-2000:], file=sys.stderr)


def summarise(res: dict, batches: list[int]) -> None:
    """The best round of each configuration and batch, ours over llama.cpp's, printed."""
    configs, best = res["configs"], {}
    for run in res["runs"]:
        k = (run["config"], run["batch"])
        if k not in best or run["tok_s"] > best[k]["tok_s"]:
            best[k] = run
    res["best"] = [{"config": c, "batch": b, "tok_s": v["tok_s"], "ms_step": v["ms_step"],
                    "ms_matrices": v.get("ms_matrices"), "matrices_gb_s": v.get("matrices_gb_s"), "load": v["load"]}
                   for (c, b), v in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    for peer in (p for p in LLAMAS if p in configs):  # each of ours against llama.cpp, batch by batch (best rounds)
        key = "over_" + peer.replace(".", "_").replace("-", "_")
        res[key] = {str(b): {c: best[(c, b)]["tok_s"] / best[(peer, b)]["tok_s"]
                             for c in configs if c not in LLAMAS} for b in batches}
    res["host"]["load_average_at_end"] = load_average()
    print("\nbest of rounds (tok/s, ms/step):")
    for b in batches:
        print(f"  B={b:2d}: " + "  ".join(f"{c} {best[(c, b)]['tok_s']:.1f} / {best[(c, b)]['ms_step']:.1f}"
                                         for c in configs))
    print("RSS MB: " + ", ".join(f"{k} {v:.0f}" for k, v in res["rss_mb"].items() if v))


def plot(res: dict, batches: list[int], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    best = {(r["config"], r["batch"]): r for r in res["best"]}
    configs = res["configs"]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    w = 0.8 / len(configs)
    for i, c in enumerate(configs):
        xs = [j + (i - len(configs) / 2 + 0.5) * w for j in range(len(batches))]
        ax[0].bar(xs, [best[(c, b)]["tok_s"] for b in batches], w, label=c)
        ax[1].bar(xs, [best[(c, b)]["ms_step"] for b in batches], w, label=c)
    for a_, label in ((ax[0], "tokens/s (all requests, end to end)"), (ax[1], "ms per decode step")):
        a_.set_xticks(range(len(batches)), [f"B={b}" for b in batches])
        a_.set_ylabel(label)
    ax[0].legend(fontsize=8)
    h = res["host"]
    fig.suptitle(f"{res['gguf']}, {res['threads']} threads, {h['cpu']}, read {h['read_gb_per_s']} GB/s, "
                 f"load {h['load_average'][0]:.1f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
