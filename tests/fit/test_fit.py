"""`tokenrouter fit` on tiny random pairs: deterministic for a seed, learns divergence where it
is learnable, and refuses bad input with a clear error and no output file."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.helpers.fitting import disturbed_pair, other_tokenizer, write_program, write_prompts
from tokenrouter.cli import main
from tokenrouter.compiler.pipeline import check_file
from tokenrouter.compiler.weights import nets as rn
from tokenrouter.fit.fitting import FitOptions, fit
from tokenrouter.fit.train import Hyper
from tokenrouter.runtime.loader import model_facts


def _fit(route, name, prompts, out, lr=1e-3, rows_per_step=1024, **kw):
    kw = {"epochs": 4, "max_tokens": 10, "batch": 8, "progress": False, "threads": 1, **kw}
    return fit(FitOptions(route=route, router=name, prompts=prompts, out=str(out),
                          hyper=Hyper(lr=lr, width=32, blocks=1, batch=rows_per_step), **kw))


@pytest.mark.slow
def test_fit_is_deterministic_for_a_seed(pair, tmp_path):
    route = write_program(str(tmp_path), pair, "r2r")
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    a = _fit(route, "r2r", prompts, tmp_path / "a.safetensors", target_share=0.4)
    b = _fit(route, "r2r", prompts, tmp_path / "b.safetensors", target_share=0.4)
    ta, tb = load_file(a.out), load_file(b.out)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert a.threshold == b.threshold
    with safe_open(a.out, "pt") as f:
        meta = f.metadata()
    assert meta[rn.META_ARCH] == "r2r" and meta[rn.META_INPUTS] == "hidden(-1):32,token_embedding:32,topk_logits(8):8"
    assert float(meta[rn.META_THRESHOLD]) == a.threshold and meta[rn.META_DIRECTION] == ">="
    prints = json.loads(meta[rn.META_MODELS])
    assert prints["reads"]["fingerprint"] == rn.folder_fingerprint(pair["slm"])
    assert prints["large"]["fingerprint"] == rn.folder_fingerprint(pair["llm"])
    report = json.load(open(a.report_json))
    assert report["data"]["heldout_prompts"] + report["data"]["train_prompts"] == 12
    assert os.path.getsize(a.report_png) > 1000
    assert a.route_lines[1] == "slm -> llm when r2r >= 0.5 rewrite"  # aligned to the program's threshold
    raw = _fit(route, "r2r", prompts, tmp_path / "raw.safetensors", target_share=0.4, align=False)
    assert raw.threshold == raw.report["heldout"]["threshold"] == pytest.approx(
        a.report["heldout"]["aligned_from_threshold"], abs=1e-4)
    for k in ("recall", "precision", "large_share", "auc"):
        assert raw.report["heldout"][k] == pytest.approx(a.report["heldout"][k], nan_ok=True), k
    # the file serves: the program checks clean against it, and warns once its large model differs
    os.makedirs(tmp_path / "w", exist_ok=True)
    os.replace(a.out, tmp_path / "w" / "r2r.safetensors")
    _, diags = check_file(route, model_facts=model_facts)
    assert diags == []
    os.makedirs(tmp_path / "x" / "w")
    other = write_program(str(tmp_path / "x"), {**pair, "llm": pair["slm"]}, "r2r")
    os.replace(tmp_path / "w" / "r2r.safetensors", tmp_path / "x" / "w" / "r2r.safetensors")
    _, diags = check_file(other, model_facts=model_facts)
    assert [d.code for d in diags] == ["W004"] and "the large model" in diags[0].message


@pytest.mark.parametrize("kind, name", [("r2r", "r2r"), ("citer", "citer"), ("co_llm", "defer")])
def test_learnable_divergence_gives_a_high_held_out_auc(tmp_path, kind, name):
    """Where the small model's divergence is a function of its hidden state, every kind
    learns it (held-out AUC well above chance), while the entropy rule cannot see it."""
    paths, _ = disturbed_pair(str(tmp_path))
    route = write_program(str(tmp_path), paths, kind)
    prompts = write_prompts(tmp_path / "p.jsonl", 40, seed=3)
    res = _fit(route, name, prompts, tmp_path / "w" / f"{name}.safetensors", epochs=20, max_tokens=16,
               lr=3e-3, rows_per_step=64, target_share=0.5)
    held = res.report["heldout"]
    assert 0.2 < held["divergent_rate"] < 0.8
    assert held["rows"] >= 100 and held["auc"] > 0.75, held
    assert res.report["entropy_rule_same_share"]["auc"] < held["auc"] - 0.1


def _cli(tmp_path, capsys, route, name, prompts):
    out = tmp_path / "out" / "r.safetensors"
    status = main(["fit", route, "--router", name, "--prompts", str(prompts), "--out", str(out),
                   "--epochs", "1", "--max-tokens", "4", "--quiet"])
    err = capsys.readouterr().err
    assert status == 1
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    return err


def test_bad_input_is_refused_and_writes_nothing(pair, tmp_path, capsys):
    route = write_program(str(tmp_path), pair, "citer")
    good = write_prompts(tmp_path / "good.jsonl", 4)
    err = _cli(tmp_path, capsys, route, "citer", tmp_path / "missing.jsonl")
    assert "missing.jsonl: no such prompts file" in err
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "empty.jsonl: no prompts (the file is empty)" in _cli(tmp_path, capsys, route, "citer", tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "one"}\n{"prompt": "two"\n')
    assert "bad.jsonl:2: not valid JSON" in _cli(tmp_path, capsys, route, "citer", tmp_path / "bad.jsonl")
    (tmp_path / "nokey.jsonl").write_text('{"text": "one"}\n')
    assert 'nokey.jsonl:1: expected an object with a non-empty "prompt" string' in _cli(
        tmp_path, capsys, route, "citer", tmp_path / "nokey.jsonl")
    err = _cli(tmp_path, capsys, route, "nope", good)
    assert "no router or head named 'nope' (declared: citer)" in err
    os.makedirs(tmp_path / "m")
    mixed = write_program(str(tmp_path / "m"), {"slm": pair["slm"], "llm": other_tokenizer(str(tmp_path))}, "citer")
    err = _cli(tmp_path, capsys, mixed, "citer", good)
    assert "E309" in err and "do not share a tokenizer" in err


def test_cached_passes_give_the_same_fit(pair, tmp_path, monkeypatch):
    """--cache: a CITER fit served from the cached pass of an R2R fit (whose input layout
    begins with CITER's) writes exactly the file a fit without the cache writes."""
    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path / "cache"))
    r2r = write_program(str(tmp_path), pair, "r2r")
    citer = write_program(str(tmp_path), pair, "citer")
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    _fit(r2r, "r2r", prompts, tmp_path / "r.safetensors", cache=True)
    assert len(os.listdir(tmp_path / "cache" / "fit")) == 3  # rows, text, layout index
    a = _fit(citer, "citer", prompts, tmp_path / "a.safetensors", cache=True)
    assert len(os.listdir(tmp_path / "cache" / "fit")) == 3  # served by slicing, nothing new
    b = _fit(citer, "citer", prompts, tmp_path / "b.safetensors")
    ta, tb = load_file(a.out), load_file(b.out)
    assert all(torch.equal(ta[k], tb[k]) for k in ta) and a.threshold == b.threshold
