"""Shared fixtures of the tuner tests: synthetic profiles and tiny checkpoint folders."""

from __future__ import annotations

import json
import os

import pytest

from tokenrouter.tuner.profile import Profile


@pytest.fixture
def paper_profile():
    """A closed-loop study's step times: 6.0 and 27.9 ms, +2% per extra request,
    co-located 1.5x slower."""
    return Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=0.5)


def write_tiny_model(folder: str, hidden: int, layers: int, seed: int) -> str:
    """A tiny random-weight Llama checkpoint folder with a byte-level tokenizer."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tokenrouter.runtime.engine.config import ModelConfig
    from tokenrouter.runtime.loader.hf import expected_shapes

    os.makedirs(folder, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(os.path.join(folder, "tokenizer.json"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(vocab),
           "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
           "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    g = torch.Generator().manual_seed(seed)
    weights = {n: (torch.ones(s) if n.endswith("norm.weight") else torch.randn(s, generator=g) * 0.05)
               for n, s in expected_shapes(ModelConfig.from_hf(cfg)).items()}
    save_file(weights, os.path.join(folder, "model.safetensors"))
    return folder


@pytest.fixture
def tiny_route(tmp_path):
    """A .route program over two tiny models (a seeded coin routes small -> large)."""
    small = write_tiny_model(str(tmp_path / "small"), 32, 1, 1)
    large = write_tiny_model(str(tmp_path / "large"), 64, 2, 2)
    path = tmp_path / "tiny.route"
    path.write_text(f'tokenrouter 1\nmodel small = "{small}"\nmodel large = "{large}"\n'
                    "route {\n  start small\n  small -> large when bernoulli(0.2, 7) rewrite\n"
                    "  visit large max 1 then small\n}\nserve {\n  batch large = auto\n  max_wait = 20ms\n}\n")
    return path
