"""The model configuration the engine needs, read from a Hugging Face `config.json` dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModel(ValueError):
    """The checkpoint is of an architecture the engine does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm on q and k (Qwen3)
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "ModelConfig":
        archs = d.get("architectures") or []
        arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(d.get("model_type", ""))
        if arch is None:
            raise UnsupportedModel(
                f"unsupported architecture {archs or d.get('model_type')!r}; "
                f"supported: {', '.join(sorted(ARCHITECTURES))}")
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        # transformers >= 5 writes rope_theta (and any scaling) into `rope_parameters`.
        rope_params = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or (
            rope_params if rope_params.get("rope_type", "default") != "default" else None)
        theta = d.get("rope_theta")
        bias = d.get("attention_bias")
        return cls(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta if theta is not None else rope_params.get("rope_theta", 10000.0),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(bias) if bias is not None else arch == "qwen2",
            qk_norm=arch == "qwen3",
            rope_scaling=tuple(sorted(scaling.items())) if scaling else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
