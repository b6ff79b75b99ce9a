"""Fixtures for the .route front-end tests: tiny model folders (config.json, and a
tokenizer.json when asked) that programs can point at with `model_paths`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write_model_folder(folder: Path, hidden: int, layers: int, vocab: list[str] | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
              "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
              "num_attention_heads": 2, "num_key_value_heads": 1}
    (folder / "config.json").write_text(json.dumps(config))
    if vocab is not None:
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(folder / "tokenizer.json"))
    return str(folder)


@pytest.fixture
def tiny_pair(tmp_path):
    """Two tiny model folders with the same tokenizer: {"slm": path, "llm": path}."""
    vocab = ["<unk>", "a", "b", "c"]
    return {"slm": write_model_folder(tmp_path / "slm", 24, 2, vocab),
            "llm": write_model_folder(tmp_path / "llm", 40, 3, vocab)}
