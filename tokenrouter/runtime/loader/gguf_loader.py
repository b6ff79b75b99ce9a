"""Reading a GGUF file (llama.cpp's format) into a Hugging Face config dict, float tensors under
Hugging Face parameter names, and a tokenizer.

Two facts about llama.cpp's converter matter here:
- tensor names follow llama.cpp (`blk.3.attn_q.weight`), mapped back by `_NAME_MAP`;
- for the Llama family it permutes the rows of q_proj and k_proj so that each head's rotary
  pairs are interleaved (GPT-J style) instead of split in halves (NeoX style, as Hugging Face
  does). `unpermute` undoes it; Qwen2/Qwen3 files are not permuted.
Dequantising uses the `gguf` package. This is slow-ish (seconds), so `load_model` caches the
result as a safetensors folder for `quant = none` (see `runtime/cache.py`); the quantised
formats read the file's own blocks in place (`kernels.blocks.BlockRows`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from tokenrouter.compiler.weights.files import DERIVED_IDENTITY
from tokenrouter.runtime.kernels.blocks import GGML_TYPES, BlockRows
from tokenrouter.runtime.loader.gguf_file import TensorInfo, read_header
from tokenrouter.runtime.loader.errors import LoadError, MissingFile, UnsupportedArchitecture, UnsupportedQuantization
from tokenrouter.runtime.loader.gguf_tokenizer import tokenizer_from_gguf

log = logging.getLogger(__name__)

_HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_NAME_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str:
    """Hugging Face parameter name of a llama.cpp tensor name."""
    if gguf_name in _NAME_MAP:
        return _NAME_MAP[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_MAP:
        return f"model.layers.{m.group(1)}.{_BLOCK_MAP[m.group(2)]}.{m.group(3)}"
    raise UnsupportedArchitecture(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart we support")


def permute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order from Hugging Face's: within each head, rows [0..d/2) and
    [d/2..d) are interleaved. Used by tests to write GGUF files as the converter does."""
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *rest).transpose(1, 2).reshape(w.shape)


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `permute_rows`: back to Hugging Face's rotate-half layout."""
    rest = w.shape[1:]
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def read_metadata(path: str) -> dict[str, Any]:
    """A GGUF file's metadata (`gguf_file.read_header`), without the package's own keys."""
    meta, _ = read_header(path)
    return {k: v for k, v in meta.items() if not k.startswith("GGUF.")}


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str],
                         embed_rows: int) -> dict[str, Any]:
    """The Hugging Face `config.json` dict this GGUF describes."""
    arch = meta.get("general.architecture")
    if arch not in _HF_CLASS:
        raise UnsupportedArchitecture(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(_HF_CLASS))}")
    if "rope_freqs.weight" in tensor_names:
        raise UnsupportedArchitecture(
            "this GGUF carries Llama-3 rope frequency factors (rope_freqs), which are not supported "
            "from GGUF; use the model's Hugging Face folder instead")

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            if required:
                raise LoadError(f"GGUF metadata lacks {full!r}")
            return default
        return meta[full]

    hidden = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    kv = int(get("attention.head_count_kv", heads))
    head_dim = int(get("attention.key_length", hidden // heads))
    scaling_type = get("rope.scaling.type", "none")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor", 1.0))}
    elif scaling_type not in ("none", None):
        raise UnsupportedArchitecture(f"GGUF rope scaling {scaling_type!r} is not supported")
    cfg = {
        "architectures": [_HF_CLASS[arch]],
        "model_type": arch,
        "vocab_size": embed_rows,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length", required=True)),
        "num_hidden_layers": int(get("block_count", required=True)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    return cfg


def _dequantize(path: str, tensor: TensorInfo) -> np.ndarray:
    """A tensor's float32 values, dequantised by the `gguf` package from the file's bytes."""
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(tensor.nbytes,))
    if tensor.kind == "F64":
        return data.view(np.float64).astype(np.float32)
    if len(tensor.shape) == 2:
        data = data.reshape(tensor.shape[1], -1)
    try:
        return dequantize(data, Q[tensor.kind])
    except NotImplementedError:
        raise UnsupportedQuantization(
            f"GGUF tensor {tensor.name!r} is stored as {tensor.kind}, which cannot be "
            "dequantised; re-export it as F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1 or a K-quant") from None


_FLOAT = ("F32", "F16", "BF16", "F64")


def _block_rows(path: str, tensor: TensorInfo) -> BlockRows:
    """A quantised GGUF matrix as its own blocks, mapped from the file (`BlockRows`)."""
    kind = tensor.kind
    if kind not in GGML_TYPES or len(tensor.shape) != 2:
        raise UnsupportedQuantization(
            f"GGUF tensor {tensor.name!r} is stored as {kind}, which the quantised formats cannot read in place "
            f"(block types: {', '.join(k for k in GGML_TYPES if k not in _FLOAT)}); use quant=none "
            "(dequantise to float)")
    k, n = (int(d) for d in tensor.shape)
    return BlockRows.from_file(path, tensor.offset, kind, (n, k))


def read_gguf(path: str, native: bool = False):
    """(config dict, {hf name: tensor}, Tokenizer) of a GGUF file: float32 tensors, or with
    `native` every quantised matrix as its own blocks (`BlockRows`, mapped from the file; the
    engine decodes them for its kernels or reads rows of them in place) and the float ones as
    float32. A block type the row reader does not take is an `UnsupportedQuantization`
    naming the tensor."""
    tensors, config, tokenizer = _open(path)
    permute = config["model_type"] == "llama"
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    weights: dict[str, torch.Tensor | BlockRows] = {}
    every = max(1, len(tensors) // 4)
    for i, t in enumerate(tensors):
        if not native and i % every == 0:  # converting takes seconds to minutes: a line a quarter
            log.info("%s: dequantising tensor %d of %d", os.path.basename(path), i + 1, len(tensors))
        name = hf_name(t.name)
        if native and t.kind not in _FLOAT:
            w = _block_rows(path, t)
        else:
            w = torch.from_numpy(np.array(_dequantize(path, t), dtype=np.float32))  # a writable copy
            w = w.reshape(tuple(int(d) for d in reversed(t.shape)))
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _rows(w, lambda x: unpermute(x, heads))
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _rows(w, lambda x: unpermute(x, kv))
        weights[name] = w if isinstance(w, BlockRows) else w.contiguous()
    return config, weights, tokenizer


def _rows(w, fn):
    return w.map_rows(fn) if isinstance(w, BlockRows) else fn(w)


def read_gguf_meta(path: str):
    """(config dict, Tokenizer) of a GGUF file, from its metadata alone (no tensor is read)."""
    _, config, tokenizer = _open(path)
    return config, tokenizer


def _open(path: str):
    """(tensor infos, config dict, Tokenizer) of a GGUF file; LoadError if it is not one."""
    if not os.path.isfile(path):
        raise MissingFile(f"no such GGUF file: {path}")
    meta, tensors = read_header(path)
    embed = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise LoadError(f"{path}: GGUF has no token_embd.weight tensor")
    config = config_from_metadata(meta, {t.name for t in tensors}, embed_rows=int(embed.shape[-1]))
    tokenizer = tokenizer_from_gguf(meta)
    config["eos_token_id"] = list(tokenizer.eos_token_ids) or config["eos_token_id"]
    return tensors, config, tokenizer


def write_gguf_meta(path: str, folder: str) -> None:
    """What a GGUF file's cache entry holds besides the file's weights: config.json, the
    tokenizer (tokenizer.json, tokenizer_config.json) and the file's identity (DERIVED_IDENTITY:
    its size and a hash of its first and last MiB), which `folder_fingerprint` reads, since the
    folder holds no weights to fingerprint."""
    config, tokenizer = read_gguf_meta(path)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    tokenizer.save(folder)
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read())
    with open(os.path.join(folder, DERIVED_IDENTITY), "w", encoding="utf-8") as f:
        json.dump({"gguf": {"size": size, "first_last_mib_sha256": digest.hexdigest()}}, f, indent=1, sort_keys=True)
