"""`scripts/gpu_check.sh` on a host without CUDA (the GPU itself is not tested here): it exits
cleanly with a JSON that says so; its checks and benchmark run as written on the CPU
(`--dry-run-cpu`); and its torch-eager baseline computes the same model as our engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.py")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: the script would run its checks")
def test_without_cuda_it_exits_cleanly_and_says_so(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run(["sh", os.path.join(ROOT, "scripts", "gpu_check.sh"), str(out)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "no_cuda" and doc["torch"] == torch.__version__ and doc["checks"] == {}


def test_the_eager_baseline_computes_our_engines_model():
    gc = _module()
    cfg = gc.config(gc.TINY)
    w = gc.random_weights(cfg, seed=7)
    ids = torch.randint(0, cfg.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    eng = gc.engine(cfg, w, block_size=4, num_blocks=64, max_model_len=64)
    ref = gc.EagerDecoder(cfg, w, 3, 40)
    with torch.inference_mode():
        a, b = eng.step([(i, ids[i].tolist()) for i in range(3)]).logits, ref.forward(ids)
        for _ in range(4):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * b.abs().max().item())
            nxt = b.argmax(-1)
            a, b = eng.step([(i, [int(t)]) for i, t in enumerate(nxt)]).logits, ref.forward(nxt[:, None])


@pytest.mark.slow
def test_the_checks_and_the_benchmark_run_on_the_cpu(tmp_path):
    out = tmp_path / "dry.json"
    r = subprocess.run([sys.executable, SCRIPT, "--dry-run-cpu", "--out", str(out)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and not doc["failed"]
    assert doc["checks"]["graphs_replay_eager"]["extend_graphs"] > 0
    assert set(doc["bench"]["runs"]) == {"1", "8", "32"}
    assert doc["bench"]["baseline_agrees"]["same_argmax"]
