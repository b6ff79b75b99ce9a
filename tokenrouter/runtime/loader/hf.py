"""Hugging Face checkpoint folders: `config.json`, `*.safetensors` (one file or shards with an
index), `tokenizer.json`. Also writes such folders, which is how the cache stores converted
GGUF files and generated models, so one reader serves all three."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tokenrouter.runtime.engine.config import ModelConfig, UnsupportedModel
from tokenrouter.runtime.loader.errors import LoadError, MissingFile, ShapeMismatch, UnsupportedArchitecture
from tokenrouter.runtime.loader.tokenizer import Tokenizer


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter the engine reads, with its shape. `lm_head.weight` is listed only when
    the embeddings are not tied."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        })
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """The weights the engine needs, each checked against the config's shape. Extra tensors
    (rotary caches, a duplicate lm_head of tied embeddings) are dropped."""
    shapes = expected_shapes(cfg)
    missing = [n for n in shapes if n not in weights]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ShapeMismatch(f"{where}: weights missing for {', '.join(missing[:3])}{more}")
    for name, shape in shapes.items():
        got = tuple(weights[name].shape)
        if got != shape:
            raise ShapeMismatch(f"{where}: {name} has shape {list(got)} but config.json implies {list(shape)}")
    return {n: weights[n] for n in shapes}


def parse_config(d: dict[str, Any], where: str) -> ModelConfig:
    try:
        return ModelConfig.from_hf(d)
    except UnsupportedModel as exc:
        raise UnsupportedArchitecture(f"{where}: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise LoadError(f"{where}: config.json lacks or misstates {exc}") from None


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise LoadError(f"{path}: invalid JSON ({exc})") from None


def read_weights(path: str) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        if glob.glob(os.path.join(path, "*.bin")):
            raise LoadError(f"{path}: only pickle (*.bin) weights found; convert them to safetensors")
        raise MissingFile(f"{path}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(f))
        except Exception as exc:
            raise LoadError(f"{f}: unreadable safetensors file ({exc})") from None
    return weights


def read_folder(path: str, dtype: torch.dtype = torch.float32):
    """(ModelConfig, checked weights in `dtype`, Tokenizer, config dict) of a checkpoint folder."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise MissingFile(f"{path}: no config.json (expected a Hugging Face checkpoint folder)")
    raw = _read_json(cfg_path)
    cfg = parse_config(raw, cfg_path)
    weights = check_weights(cfg, read_weights(path), path)
    weights = {n: w.to(dtype) for n, w in weights.items()}
    eos = list(cfg.eos_token_ids)
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        g = _read_json(gen_path).get("eos_token_id")
        eos += g if isinstance(g, list) else ([] if g is None else [g])
    tokenizer = Tokenizer.from_dir(path, eos_token_ids=eos)
    return cfg, weights, tokenizer, raw


def write_folder(path: str, config: dict[str, Any], weights: dict[str, torch.Tensor],
                 tokenizer: Tokenizer | None) -> None:
    """Write a checkpoint folder (not atomic by itself: `runtime/cache.py` writes into a temp dir)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    save_file({n: w.contiguous() for n, w in weights.items()}, os.path.join(path, "model.safetensors"))
    if tokenizer is not None:
        tokenizer.save(path)
