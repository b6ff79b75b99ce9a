"""The engine on a CUDA machine, in one call: its CUDA checks and a short benchmark against
torch eager, everything written to one JSON file. Needs only torch and this repository (no
network, no other package): run by `scripts/gpu_check.sh`, which bounds it to 8 minutes.

Checks (each a pass/fail with its measured difference):
- `graphs_replay_eager`: CUDA graphs for decodes and short extends (1-4 tokens a request,
  batches padded to their bucket) give the eager forward's logits and hidden states;
- `cuda_float64_matches_cpu`: `device = cuda` in float64 gives the CPU float64 engine's logits
  over a prefill, extends and decodes (to 1e-9);
- `cuda_float32_follows_cpu_float64`: float32 on the GPU (TF32 off) within 2e-4 of them;
- `pytest_cuda`: the repository's CUDA-marked tests (`pytest -m cuda`), where pytest and the
  test dependencies are installed (else reported as not run: the checks above cover them).
Benchmark (`bench`): a Qwen3-0.6B-shaped model with random weights in bfloat16, 64-token
prompts then 64 decode steps at batch 1, 8 and 32: our engine with CUDA graphs, our engine
eager (`cuda_graphs=False`), and a plain torch eager decoder of the same weights (a contiguous
KV cache and `scaled_dot_product_attention`, written here: what one writes without an
engine), tokens/s of the decode steps, best of 3.

    python scripts/gpu_check.py --out gpu_check.json [--quick]
Without CUDA it writes {"status": "no_cuda", ...}, says so on stderr and exits 0.
`--dry-run-cpu` runs the same code on the CPU instead (graphs as their static shapes run
eagerly, a tiny benchmark model): how the script itself is tested without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TINY = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
QWEN3_06B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}


def config(shape: dict, family: str = "qwen3"):
    from tokenrouter.runtime.engine.config import ModelConfig
    return ModelConfig(architecture=family, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                       tie_word_embeddings=True, attention_bias=family == "qwen2", qk_norm=family == "qwen3",
                       **shape)


def random_weights(cfg, device="cpu", dtype=torch.float32, seed=0) -> dict[str, torch.Tensor]:
    """Hugging Face-named random weights for `cfg` (norms near 1, matrices N(0, 0.02))."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d

    def mat(*shape):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(dtype)

    w = {"model.embed_tokens.weight": mat(cfg.vocab_size, h), "model.norm.weight": norm(h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
                  p + "self_attn.q_proj.weight": mat(q, h), p + "self_attn.k_proj.weight": mat(kv, h),
                  p + "self_attn.v_proj.weight": mat(kv, h), p + "self_attn.o_proj.weight": mat(h, q),
                  p + "mlp.gate_proj.weight": mat(inter, h), p + "mlp.up_proj.weight": mat(inter, h),
                  p + "mlp.down_proj.weight": mat(h, inter)})
        if cfg.qk_norm:
            w.update({p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d)})
        if cfg.attention_bias:
            w.update({p + "self_attn.q_proj.bias": mat(q), p + "self_attn.k_proj.bias": mat(kv),
                      p + "self_attn.v_proj.bias": mat(kv)})
    return w


def engine(cfg, weights, **kw):
    from tokenrouter.runtime.engine.engine import Engine
    from tokenrouter.runtime.engine.options import EngineOptions
    return Engine(cfg, weights, EngineOptions(**kw))


# ------------------------------------------------------------------ checks

def _steps(vocab: int, seqs: int, steps: int, seed: int, max_q: int = 4):
    """A prefill per sequence, then `steps` steps of decodes and short extends (all sequences
    adding the same count, so the graphs serve them)."""
    g = torch.Generator().manual_seed(seed)
    yield [(i, torch.randint(0, vocab, (5 + 3 * i,), generator=g).tolist()) for i in range(seqs)]
    for s in range(steps):
        live = seqs if s < steps // 2 else max(1, seqs - 2)  # a smaller batch: another bucket
        q = 1 + (s % max_q)
        yield [(i, torch.randint(0, vocab, (q,), generator=g).tolist()) for i in range(live)]


def check_graphs(device: str = "cuda") -> dict:
    from tokenrouter.protocol.step import FeatureNeeds
    cfg = config(TINY)
    w = random_weights(cfg)
    kw = dict(device=device, dtype=torch.float32, block_size=16, num_blocks=128, max_model_len=512)
    g = engine(cfg, w, cuda_graphs=True if device == "cuda" else "eager", **kw)
    e = engine(cfg, w, cuda_graphs=False, **kw)
    needs = FeatureNeeds(hidden_layers=(0, 2, -1))
    worst = 0.0
    for batch in _steps(cfg.vocab_size, 6, 16, seed=1):
        a, b = g.step(batch, needs), e.step(batch, needs)
        worst = max(worst, (a.logits - b.logits).abs().max().item(),
                    *((a.hidden[k] - b.hidden[k]).abs().max().item() for k in needs.hidden_layers))
    keys = sorted(g.graphs.graphs)
    extends = [k for k in keys if k[1] > 1]
    ok = worst <= 1e-5 and bool(extends)
    return {"ok": ok, "max_abs_diff": worst, "tolerance": 1e-5, "graphs_captured": [list(k) for k in keys],
            "extend_graphs": len(extends)}


def _run_pair(cfg, w, cpu_kw, gpu_kw) -> float:
    """max |logits difference| between a CPU and a CUDA engine over the same steps, relative
    to the CPU logits' largest magnitude."""
    cpu, gpu = engine(cfg, w, **cpu_kw), engine(cfg, w, **gpu_kw)
    worst = 0.0
    for batch in _steps(cfg.vocab_size, 4, 12, seed=2, max_q=9):
        a, b = cpu.step(batch).logits, gpu.step(batch).logits.to("cpu", torch.float64)
        worst = max(worst, ((a.double() - b).abs().max() / a.abs().max()).item())
    return worst


def check_float64(device: str = "cuda") -> dict:
    out = {}
    for family in ("llama", "qwen2", "qwen3"):
        cfg = config(TINY, family)
        w = random_weights(cfg, dtype=torch.float64, seed=3)
        base = dict(dtype=torch.float64, block_size=4, num_blocks=128, max_model_len=256)
        out[family] = _run_pair(cfg, w, dict(device="cpu", **base), dict(device=device, cuda_graphs=False, **base))
    worst = max(out.values())
    return {"ok": worst <= 1e-9, "max_rel_diff": out, "tolerance": 1e-9}


def check_float32(device: str = "cuda") -> dict:
    cfg = config(TINY)
    w = random_weights(cfg, dtype=torch.float64, seed=4)
    base = dict(block_size=4, num_blocks=128, max_model_len=256)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    worst = _run_pair(cfg, w, dict(device="cpu", dtype=torch.float64, **base),
                      dict(device=device, dtype=torch.float32, **base))
    return {"ok": worst <= 2e-4, "max_rel_diff": worst, "tolerance": 2e-4}


def pytest_cuda(budget_s: float) -> dict:
    """The repository's CUDA-marked tests, where pytest and their dependencies are installed."""
    if importlib.util.find_spec("pytest") is None:
        return {"ok": None, "ran": False, "why": "pytest is not installed here (the built-in checks cover the same)"}
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={xml}",
               os.path.join(ROOT, "tests")]
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
        except subprocess.TimeoutExpired:
            return {"ok": False, "ran": True, "why": f"timed out after {budget_s:.0f} s"}
        if not os.path.isfile(xml):
            return {"ok": False, "ran": True, "why": "pytest wrote no report", "tail": (r.stdout + r.stderr)[-3000:]}
        suite = ET.parse(xml).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                  if c.find("failure") is not None or c.find("error") is not None]
        # rc 5: no test collected (the marker selects nothing importable here)
        return {"ok": r.returncode == 0, "ran": True, "returncode": r.returncode, **counts, "failed": failed,
                "tail": (r.stdout + r.stderr)[-3000:] if r.returncode else ""}


# ------------------------------------------------------------------ the eager baseline

class EagerDecoder:
    """The Qwen3 decoder in plain torch ops, as one writes it without an engine: a contiguous
    KV cache [batch, kv_heads, max_len, head_dim] per layer, rotate-half RoPE, SDPA."""

    def __init__(self, cfg, w: dict, batch: int, max_len: int):
        self.cfg, self.w = cfg, w
        dev, dt = w["model.norm.weight"].device, w["model.norm.weight"].dtype
        d = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
        f = torch.arange(max_len, device=dev, dtype=torch.float32)[:, None] * inv[None]
        emb = torch.cat([f, f], -1)
        self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)
        shape = (batch, cfg.num_key_value_heads, max_len, d)
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(cfg.num_hidden_layers)]
        self.len = 0

    def _rope(self, x, pos):
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]
        x1, x2 = x.chunk(2, -1)
        return x * c + torch.cat([-x2, x1], -1) * s

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        b, t = ids.shape
        nh, kvh, d, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        pos = torch.arange(self.len, self.len + t, device=ids.device)
        h = w["model.embed_tokens.weight"][ids]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = F.rms_norm(h, (h.shape[-1],), w[p + "input_layernorm.weight"], eps)
            q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(b, t, nh, d).transpose(1, 2)
            k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(b, t, kvh, d).transpose(1, 2)
            v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(b, t, kvh, d).transpose(1, 2)
            q = F.rms_norm(q, (d,), w[p + "self_attn.q_norm.weight"], eps)
            k = F.rms_norm(k, (d,), w[p + "self_attn.k_norm.weight"], eps)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.k[i][:, :, self.len:self.len + t] = k
            self.v[i][:, :, self.len:self.len + t] = v
            end = self.len + t
            o = F.scaled_dot_product_attention(q, self.k[i][:, :, :end], self.v[i][:, :, :end],
                                               is_causal=self.len == 0 and t > 1, enable_gqa=True)
            h = h + F.linear(o.transpose(1, 2).reshape(b, t, nh * d), w[p + "self_attn.o_proj.weight"])
            x = F.rms_norm(h, (h.shape[-1],), w[p + "post_attention_layernorm.weight"], eps)
            gate, up = F.linear(x, w[p + "mlp.gate_proj.weight"]), F.linear(x, w[p + "mlp.up_proj.weight"])
            h = h + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        self.len += t
        x = F.rms_norm(h[:, -1], (h.shape[-1],), w["model.norm.weight"], eps)
        return F.linear(x, w["model.embed_tokens.weight"])


# ------------------------------------------------------------------ the benchmark

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, steps: int, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return time.perf_counter() - t0


def bench(batches=(1, 8, 32), prompt=64, steps=64, rounds=3, dtype=torch.bfloat16, shape=QWEN3_06B,
          device: str = "cuda") -> dict:
    cfg = config(shape)
    w = random_weights(cfg, device=device, dtype=dtype, seed=5)
    max_len = prompt + steps * (rounds + 1) + 8
    out = {"model": {"shape": shape, "dtype": str(dtype), "weights": "random"}, "prompt": prompt,
           "decode_steps": steps, "rounds": rounds, "runs": {}}
    blocks = max(batches) * (-(-max_len // 16)) + 8
    engines = {"ours_graphs": engine(cfg, w, device=device, dtype=dtype, cuda_graphs=True if device == "cuda" else
                                     "eager", max_model_len=max_len, num_blocks=blocks),
               "ours_eager": engine(cfg, w, device=device, dtype=dtype, cuda_graphs=False, max_model_len=max_len,
                                    num_blocks=blocks)}
    g = torch.Generator().manual_seed(6)
    for b in batches:
        ids = torch.randint(0, cfg.vocab_size, (b, prompt), generator=g)
        row = {}
        for name, eng in engines.items():
            best = math.inf
            for r in range(rounds + 1):  # round 0 warms up (and captures the graphs)
                sids = [(name, b, r, i) for i in range(b)]
                lg = eng.step([(s, ids[i].tolist()) for i, s in enumerate(sids)]).logits
                state = {"lg": lg}

                def one(eng=eng, sids=sids, state=state):
                    nxt = state["lg"].argmax(-1).tolist()
                    state["lg"] = eng.step([(s, [t]) for s, t in zip(sids, nxt)]).logits
                dt = _timed(one, steps, device)
                for s in sids:
                    eng.free(s)
                if r:
                    best = min(best, dt)
            row[name] = {"tok_s": b * steps / best, "ms_step": best / steps * 1e3}
        best = math.inf
        for r in range(rounds + 1):
            ref = EagerDecoder(cfg, w, b, prompt + steps + 1)
            with torch.inference_mode():
                state = {"lg": ref.forward(ids.to(device))}

                def one(ref=ref, state=state):
                    state["lg"] = ref.forward(state["lg"].argmax(-1, keepdim=True))
                dt = _timed(one, steps, device)
            if r:
                best = min(best, dt)
        row["torch_eager"] = {"tok_s": b * steps / best, "ms_step": best / steps * 1e3}
        row["ours_graphs_over_torch_eager"] = row["ours_graphs"]["tok_s"] / row["torch_eager"]["tok_s"]
        out["runs"][str(b)] = row
        print(f"bench B={b}: " + ", ".join(f"{k} {v['tok_s']:.0f} tok/s" for k, v in row.items()
                                             if isinstance(v, dict)), file=sys.stderr, flush=True)
    # the baseline computes the same model: its first greedy tokens agree with ours
    eng = engines["ours_eager"]
    ids = torch.randint(0, cfg.vocab_size, (2, prompt), generator=g)
    a = eng.step([(("agree", i), ids[i].tolist()) for i in range(2)]).logits.float()
    with torch.inference_mode():
        b_ = EagerDecoder(cfg, w, 2, prompt + 1).forward(ids.to(device)).float()
    out["baseline_agrees"] = {"same_argmax": bool((a.argmax(-1) == b_.argmax(-1)).all()),
                              "max_rel_diff": ((a - b_).abs().max() / b_.abs().max()).item()}
    return out


# ------------------------------------------------------------------ the run

def _device() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "capability": list(torch.cuda.get_device_capability(0)),
            "memory_gib": round(p.total_memory / 2 ** 30, 1), "cuda": torch.version.cuda, "count": torch.cuda.device_count()}


def _record(res: dict, name: str, fn, *args) -> None:
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            r = fn(*args)
    except Exception as exc:  # a failing check is recorded and the others still run
        r = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    r["seconds"] = round(time.perf_counter() - t0, 2)
    res["checks"][name] = r
    print(f"{name}: {'ok' if r.get('ok') else ('not run' if r.get('ok') is None else 'FAILED')} "
          f"({r['seconds']} s)", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--quick", action="store_true", help="a tiny model in the benchmark (a dry run of the script)")
    ap.add_argument("--pytest-budget-s", type=float, default=180.0)
    ap.add_argument("--dry-run-cpu", action="store_true", help="the same code on the CPU (tests the script)")
    a = ap.parse_args()
    started = time.time()
    res = {"script": "scripts/gpu_check.py", "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
           "git": _git(), "checks": {}}
    device = "cpu" if a.dry_run_cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        res["status"] = "no_cuda"
        res["why"] = "torch sees no CUDA device here: nothing to check (run this on a CUDA machine)"
        _write(a.out, res, started)
        print(f"gpu_check: {res['why']}; wrote {a.out}", file=sys.stderr)
        return 0
    res["device"] = _device() if device == "cuda" else {"name": "cpu (dry run)"}
    _record(res, "graphs_replay_eager", check_graphs, device)
    _record(res, "cuda_float64_matches_cpu", check_float64, device)
    _record(res, "cuda_float32_follows_cpu_float64", check_float32, device)
    if device == "cuda":
        _record(res, "pytest_cuda", pytest_cuda, a.pytest_budget_s)
    t0 = time.perf_counter()
    try:
        quick = a.quick or a.dry_run_cpu
        res["bench"] = bench(shape=TINY if quick else QWEN3_06B, steps=16 if quick else 64, device=device,
                             dtype=torch.float32 if device == "cpu" else torch.bfloat16, rounds=1 if quick else 3)
    except Exception as exc:
        res["bench"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    res["bench"]["seconds"] = round(time.perf_counter() - t0, 2)
    failed = [k for k, v in res["checks"].items() if v.get("ok") is False]
    res["status"] = "failed" if failed or "error" in res["bench"] else "ok"
    res["failed"] = failed
    _write(a.out, res, started)
    print(f"gpu_check: {res['status']}{' (' + ', '.join(failed) + ')' if failed else ''}; wrote {a.out}",
          file=sys.stderr)
    return 0 if res["status"] == "ok" else 1


def _git() -> str | None:
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _write(path: str, res: dict, started: float) -> None:
    res["elapsed_s"] = round(time.time() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    raise SystemExit(main())
