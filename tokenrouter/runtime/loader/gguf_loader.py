"""Reading a GGUF file (llama.cpp's format) into a Hugging Face config dict, float tensors under
Hugging Face parameter names, and a tokenizer.

Two facts about llama.cpp's converter matter here:
- tensor names follow llama.cpp (`blk.3.attn_q.weight`), mapped back by `_NAME_MAP`;
- for the Llama family it permutes the rows of q_proj and k_proj so that each head's rotary
  pairs are interleaved (GPT-J style) instead of split in halves (NeoX style, as Hugging Face
  does). `unpermute` undoes it; Qwen2/Qwen3 files are not permuted.
Dequantising uses the `gguf` package. This is slow-ish (seconds), so `load_model` caches the
result as a safetensors folder (see `runtime/cache.py`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import Q4_K, dequantize

from tokenrouter.runtime.kernels.quant import QuantTensor
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


def _field_value(field) -> Any:
    return field.contents()


def read_metadata(reader) -> dict[str, Any]:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = _field_value(field)
        except Exception:  # an exotic field type we never use
            continue
    return meta


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


def _dequantize(tensor) -> np.ndarray:
    if tensor.tensor_type == Q.F64:
        return np.asarray(tensor.data).view(np.float64).astype(np.float32)
    try:
        return dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise UnsupportedQuantization(
            f"GGUF tensor {tensor.name!r} is stored as {tensor.tensor_type.name}, which cannot be "
            "dequantised; re-export it as F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1 or a K-quant") from None


_NATIVE = ("Q4_0", "Q4_1", "Q4_K", "Q8_0")  # held as their own codes
# K-quant mixes (Q4_K_M, Q4_K_S) store a few matrices as Q5_K or Q6_K: 5- and 6-bit codes no
# integer kernel here takes, so quant=native holds those dequantised (exactly) as float32
_NATIVE_AS_FLOAT = ("Q5_K", "Q6_K")
_FLOAT = ("F32", "F16", "BF16", "F64")


def _native_tensor(tensor):
    """A GGUF matrix as a `QuantTensor` of its own blocks (Q4_0, Q4_1, Q4_K, Q8_0), unpacked with
    numpy (the blocks' layout as the gguf package's dequantiser reads it)."""
    kind = tensor.tensor_type.name
    k, n = int(tensor.shape[0]), int(tensor.shape[1])
    g = k // 32
    if kind == "Q4_K":
        return _q4_k(np.asarray(tensor.data), n, k)
    if kind in ("Q4_0", "Q4_1"):
        size = 18 if kind == "Q4_0" else 20
        b = np.asarray(tensor.data).reshape(n, g, size)
        d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
        off = 2 if kind == "Q4_0" else 4
        qs = b[..., off:off + 16]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
        zero = None
        if kind == "Q4_1":  # w = d q + m = d (q - 8) + (m + 8 d)
            m = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
            zero = torch.from_numpy(m + 8.0 * d)
        return QuantTensor("q4", torch.from_numpy(np.ascontiguousarray(codes)), torch.from_numpy(d), zero, 32, kind)
    b = np.asarray(tensor.data).reshape(n, g, 34)  # Q8_0: w = d q
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    codes = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k)
    return QuantTensor("q8", torch.from_numpy(codes.copy()), torch.from_numpy(d), None, 32, kind)


def _q4_k(data: np.ndarray, n: int, k: int) -> QuantTensor:
    """Q4_K as group-32 int4, exactly. A 144-byte block holds 256 weights in 8 sub-blocks of
    32: fp16 d and dmin, 6-bit scale sc_j and min m_j per sub-block (12 bytes), 4-bit codes q
    (sub-blocks 2i and 2i+1 share 32 bytes, low and high nibble). w = d sc_j q - dmin m_j, which
    is the int4 kernel's (q - 8) scale + zero with scale = d sc_j, zero = 8 scale - dmin m_j."""
    b = data.reshape(n * (k // 256), 144)
    d = np.ascontiguousarray(b[:, 0:2]).view(np.float16).astype(np.float32)  # [blocks, 1]
    dmin = np.ascontiguousarray(b[:, 2:4]).view(np.float16).astype(np.float32)
    sc, mins = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:16]))  # [blocks, 8] each
    scale = d * sc.astype(np.float32)
    zero = 8.0 * scale - dmin * mins.astype(np.float32)
    qs = b[:, 16:].reshape(-1, 4, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k)  # sub-block 2i low, 2i+1 high
    return QuantTensor("q4", torch.from_numpy(np.ascontiguousarray(codes)),
                       torch.from_numpy(np.ascontiguousarray(scale.reshape(n, k // 32))),
                       torch.from_numpy(np.ascontiguousarray(zero.reshape(n, k // 32))), 32, "Q4_K")


def read_gguf(path: str, native: bool = False):
    """(config dict, {hf name: float32 tensor}, Tokenizer) of a GGUF file. With `native`, matrices
    stored as Q4_0, Q4_1, Q4_K or Q8_0 come as `QuantTensor`s of their own blocks instead (float
    tensors, and Q5_K / Q6_K matrices dequantised, stay float; any other block type is an
    `UnsupportedQuantization` naming the tensor)."""
    if not os.path.isfile(path):
        raise MissingFile(f"no such GGUF file: {path}")
    try:
        reader = GGUFReader(path)
    except Exception as exc:
        raise LoadError(f"{path}: not a readable GGUF file ({exc})") from None
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise LoadError(f"{path}: GGUF has no token_embd.weight tensor")
    config = config_from_metadata(meta, names, embed_rows=int(embed.shape[-1]))
    permute = config["model_type"] == "llama"
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    weights: dict[str, torch.Tensor] = {}
    every = max(1, len(reader.tensors) // 4)
    for i, t in enumerate(reader.tensors):
        if not native and i % every == 0:  # converting takes seconds to minutes: a line a quarter
            log.info("%s: dequantising tensor %d of %d", os.path.basename(path), i + 1, len(reader.tensors))
        name = hf_name(t.name)
        kind = t.tensor_type.name
        if native and kind not in _FLOAT and not (kind in _NATIVE_AS_FLOAT and len(t.shape) == 2):
            if kind not in _NATIVE or len(t.shape) != 2:
                raise UnsupportedQuantization(
                    f"GGUF tensor {t.name!r} is stored as {kind}, which quant=native cannot run as it is "
                    f"(native block types: {', '.join(_NATIVE)}, and {', '.join(_NATIVE_AS_FLOAT)} held "
                    "as float32); use quant=none (dequantise to float) or quant=int4 / int8 (requantise on load)")
            w = _native_tensor(t)
            fix = lambda x: x.contiguous()  # noqa: E731
            if permute and name.endswith("q_proj.weight"):
                fix = lambda x: unpermute(x, heads).contiguous()  # noqa: E731
            elif permute and name.endswith("k_proj.weight"):
                fix = lambda x: unpermute(x, kv).contiguous()  # noqa: E731
            weights[name] = w.map_rows(fix)
            continue
        w = torch.from_numpy(np.array(_dequantize(t), dtype=np.float32))  # a writable copy
        expected = tuple(int(d) for d in reversed(t.shape))
        w = w.reshape(expected)
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute(w, heads)
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute(w, kv)
        weights[name] = w.contiguous()
    tokenizer = tokenizer_from_gguf(meta)
    config["eos_token_id"] = list(tokenizer.eos_token_ids) or config["eos_token_id"]
    return config, weights, tokenizer
