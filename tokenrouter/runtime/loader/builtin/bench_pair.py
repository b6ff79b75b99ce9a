"""The benchmark pair: two random-weight models of the same architecture (Qwen3, as the paper's
Qwen3-0.6B / Qwen3-32B pair) and the SmolLM2 tokenizer, shaped so that their decode step-time
ratio on this project's 2-core CPU is close to the paper's 27.9 ms / 6.0 ms = 4.6x.

The shapes were chosen by measuring the engine (see docs/models.md). Weights are generated from
a fixed seed, so every process that builds them gets the same model; they are cached like any
other model.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.hf import expected_shapes, write_folder
from tokenrouter.runtime.loader.tokenizer import Tokenizer

SEED = 20240611
_COMMON = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 49152,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 4096,
    "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
SHAPES: dict[str, dict[str, int]] = {
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64},
    "large": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 14,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64},
}


def bench_config(which: str) -> dict[str, Any]:
    return {**_COMMON, **SHAPES[which]}


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights for `config`: N(0, 0.02) matrices, unit norms, small biases."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in sorted(expected_shapes(ModelConfig.from_hf(config)).items()):
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.randn(shape, generator=gen) * 0.02
    return out


def bench_entry(which: str, smollm2_entry: tuple[str, dict[str, Any], Callable[[str], None]]):
    """(slug, key, build) of `bench-small` or `bench-large`."""
    config = bench_config(which)
    seed = SEED + (0 if which == "small" else 1)

    def build(tmp: str) -> None:
        tokenizer = Tokenizer.from_dir(cache.get_or_build(*smollm2_entry))
        write_folder(tmp, config, random_weights(config, seed), tokenizer)

    key = {"kind": "random", "source": f"random seed {seed}", "config": config, "seed": seed,
           "tokenizer": smollm2_entry[1]}
    return f"bench-{which}", key, build
