"""`tokenrouter generate` and `tokenrouter models` as a user runs them."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf, write_hf_folder
from tokenrouter.cli import main
from tokenrouter.runtime.loader import Tokenizer


def _tiny(tmp_path, family="qwen3"):
    config = hf_config(family, layers=2)
    model = transformers_model(config, seed=11)
    write_hf_folder(str(tmp_path / "m"), model, config)
    return model, str(tmp_path / "m")


def test_generate_is_transformers_greedy(tmp_path, capsys):
    model, folder = _tiny(tmp_path)
    tok = Tokenizer.from_dir(folder)
    prompt = "the world"
    ids = tok.encode(prompt)
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    ref = ref[:ref.index(2)] if 2 in ref else ref  # the tokenizer's eos ends it
    assert main(["generate", "--model", folder, "--max-tokens", "12", prompt]) == 0
    assert capsys.readouterr().out == tok.decode(ref, skip_special_tokens=True) + "\n"


def test_generate_seeded_sampling_is_reproducible_and_chat_works(tmp_path, capsys):
    _, folder = _tiny(tmp_path, "llama")
    args = ["generate", "-m", folder, "--max-tokens", "8", "--temperature", "1.0", "--top-k", "50",
            "--top-p", "0.9", "--seed", "3", "--chat", "hello"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_generate_reads_gguf(tmp_path, capsys):
    config = hf_config("llama")
    model = transformers_model(config, seed=12)
    write_gguf(str(tmp_path / "m.gguf"), model, config)
    write_hf_folder(str(tmp_path / "f"), model, config)
    os.environ["TOKENROUTER_CACHE"] = str(tmp_path / "cache")
    try:
        assert main(["generate", "-m", str(tmp_path / "m.gguf"), "--max-tokens", "6", "in order"]) == 0
        from_gguf = capsys.readouterr().out
        assert main(["generate", "-m", str(tmp_path / "f"), "--max-tokens", "6", "in order"]) == 0
        assert capsys.readouterr().out == from_gguf
    finally:
        del os.environ["TOKENROUTER_CACHE"]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_errors_are_one_line_not_tracebacks(tmp_path, capsys):
    _, folder = _tiny(tmp_path)
    cfg = json.loads(open(os.path.join(folder, "config.json")).read())
    cfg["hidden_size"] = 32
    open(os.path.join(folder, "config.json"), "w").write(json.dumps(cfg))
    r = _cli("generate", "-m", folder, "hi")  # a real process: what the user sees
    assert r.returncode == 1 and "has shape" in r.stderr and "Traceback" not in r.stderr, r.stderr
    cases = [
        (["generate", "-m", str(tmp_path / "missing"), "hi"], "no such model"),
        (["generate", "-m", folder, "--temperature", "-1", "hi"], "temperature"),
    ]
    for args, message in cases:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_models_lists_the_builtins(tmp_path):
    r = _cli("models", "--json", env={"TOKENROUTER_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    rows = {m["name"]: m for m in data["models"]}
    assert list(rows) == ["smollm2-135m", "smollm2-135m-small", "bench-small", "bench-large",
                          "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
    assert data["cache"] == str(tmp_path) and not any(m["cached"] for m in rows.values())
    assert 130e6 < rows["smollm2-135m"]["parameters"] < 140e6  # SmolLM2-135M
    # 6 of 30 layers, plus an untied head (the fitted lens): 28.3M embed + 28.3M head + 6 x 3.3M
    assert 70e6 < rows["smollm2-135m-small"]["parameters"] < 80e6
    assert rows["smollm2-135m"]["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_models_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKENROUTER_CACHE", str(tmp_path))
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("NAME") and "bench-large" in table and str(tmp_path) in table
