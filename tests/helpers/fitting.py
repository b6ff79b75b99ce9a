"""Programs, prompt files and pairs for the fit tests (tiny models from `tiny.py`)."""

from __future__ import annotations

import json
import os

from tests.helpers import tiny


PROGRAMS = {
    "r2r": ('router r2r on slm = "w/r2r.safetensors" {\n  inputs = [hidden(-1), token_embedding, topk_logits(8)]\n'
            '  arch = r2r\n}\n', "slm -> llm when r2r >= 0.5 rewrite"),
    "citer": ('router citer on slm = "w/citer.safetensors" {\n  inputs = [hidden(-1)]\n  arch = citer\n}\n',
              "slm -> llm when citer < 0.5 rewrite"),
    "co_llm": ('head defer on slm = "w/defer.safetensors"\n', "slm -> llm when defer > 0.5 rewrite"),
}


def write_program(folder, paths: dict[str, str], kind: str) -> str:
    decl, rule = PROGRAMS[kind]
    text = (f'tokenrouter 1\nmodel slm = "{paths["slm"]}"\nmodel llm = "{paths["llm"]}"\n{decl}'
            f"route {{\n  start slm\n  {rule}\n  visit llm max 1 then slm\n}}\n")
    path = os.path.join(folder, f"{kind}.route")
    with open(path, "w") as f:
        f.write(text)
    return path


def write_prompts(path, n: int, seed: int = 0) -> str:
    import random
    rng = random.Random(seed)
    words = "alpha beta gamma delta river stone cloud seven apple quiet green paper".split()
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))}) + "\n")
    return str(path)


def disturbed_pair(root: str, share: float = 0.1, strength: float = 10.0, seed: int = 5) -> tuple[dict[str, str], set[int]]:
    """A pair where divergence is learnable: the small model is the large one with its
    logits disturbed on a known token subset D (below); its hidden states are the large
    model's, so a router reading them can tell where the two will differ."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    large = tiny.write_model(os.path.join(root, "large"), layers=2, hidden=32, seed=seed)
    small = os.path.join(root, "small")
    shutil.copytree(large, small)
    w = load_file(os.path.join(small, "model.safetensors"))
    vocab = w["lm_head.weight"].shape[0]
    # the small model's logits of the tokens in D get `strength * (v . h)` added: where the
    # hidden state h points along v it writes a token of D instead of the large model's
    # choice, so divergence is (close to) a linear function of h
    g = torch.Generator().manual_seed(seed)
    d = set(torch.randperm(vocab - 3, generator=g)[: max(1, int((vocab - 3) * share))].add(3).tolist())
    v = torch.randn(w["lm_head.weight"].shape[1], generator=g)
    head = w["lm_head.weight"].clone()
    head[sorted(d)] += strength * v / v.norm()
    w["lm_head.weight"] = head.contiguous()
    save_file(w, os.path.join(small, "model.safetensors"))
    return {"slm": small, "llm": large}, d


def other_tokenizer(root: str) -> str:
    """A tiny model whose vocabulary has two ids swapped: not the pair's tokenizer."""
    folder = tiny.write_model(os.path.join(root, "other"), layers=2, hidden=48, seed=9, family="qwen2")
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    with open(path, "w") as f:
        json.dump(tok, f)
    return folder
