"""Writing a model as a GGUF file that stock llama.cpp loads, with the same weights the engine
runs, so a benchmark can serve the very same model on llama.cpp's server.

The inverse of `gguf_loader.read_gguf`: Hugging Face names become llama.cpp's
(`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`), Llama-family q/k rows
are permuted as llama.cpp's converter does, and the tokenizer goes in as llama.cpp's
`tokenizer.ggml.*` metadata (byte-level BPE: tokens in id order, merges, token types, the
pre-tokenizer's name, BOS/EOS, the chat template). Matrices are written as float32 (`F32`,
which matches `quant = none`: llama.cpp then runs the same numbers, in its own float32
kernels) or, on request, F16.

    path = exported_gguf("bench-small")        # built once, kept in the model cache
    export_gguf("path/to/folder", "out.gguf")  # or anywhere
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import gguf
import numpy as np
import torch

from tokenrouter.runtime.loader import LoadedModel, checkpoint_folder, load_model
from tokenrouter.runtime.cache import cache_root
from tokenrouter.runtime.loader.errors import LoadError, UnsupportedArchitecture
from tokenrouter.runtime.loader.gguf_loader import permute_rows
from tokenrouter.runtime.loader.gguf_tokenizer import SPLIT_REGEX

# Hugging Face name -> llama.cpp name, the inverse of gguf_loader's maps.
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_ARCHES = ("llama", "qwen2", "qwen3")
# llama.cpp token types
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5
EXPORT_VERSION = 1


def gguf_name(hf: str) -> str:
    """llama.cpp's tensor name of a Hugging Face parameter name."""
    if hf in _TOP:
        return _TOP[hf]
    if hf.startswith("model.layers."):
        layer, rest = hf[len("model.layers."):].split(".", 1)
        base, _, kind = rest.rpartition(".")
        if base in _BLOCK:
            return f"blk.{layer}.{_BLOCK[base]}.{kind}"
    raise UnsupportedArchitecture(f"no llama.cpp tensor name for {hf!r}")


def pre_tokenizer_name(backend_json: dict[str, Any]) -> str:
    """The llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) that splits text as this
    `tokenizers` pre-tokenizer does; an error for a splitting rule llama.cpp has no name for."""
    pre = backend_json.get("pre_tokenizer") or {}
    kind = pre.get("type")
    if kind == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if kind == "Sequence":
        parts = pre.get("pretokenizers", [])
        types = [p.get("type") for p in parts]
        if types == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
            return "smollm"
        if types == ["Split", "ByteLevel"]:
            pattern = (parts[0].get("pattern") or {}).get("Regex")
            for name in ("llama-bpe", "qwen2"):
                if pattern == SPLIT_REGEX[name]:
                    return name
    raise UnsupportedArchitecture(f"the tokenizer's pre-tokenizer {json.dumps(pre)[:200]} has no llama.cpp "
                                  "name; pass pre=NAME to export_gguf if you know the matching one")


def tokenizer_metadata(tokenizer, vocab_size: int, pre: str | None = None) -> dict[str, Any]:
    """tokens (padded to the model's vocab_size), merges, token types and the pre-tokenizer."""
    backend_json = json.loads(tokenizer.backend.to_str())
    model = backend_json.get("model", {})
    if model.get("type") != "BPE":
        raise UnsupportedArchitecture(f"only byte-level BPE tokenizers export to GGUF (this one is "
                                      f"{model.get('type')!r})")
    n = tokenizer.vocab_size
    if n > vocab_size:
        raise LoadError(f"the tokenizer has {n} tokens but the model only {vocab_size} embedding rows")
    tokens = [tokenizer.backend.id_to_token(i) for i in range(n)]
    if any(t is None for t in tokens):
        raise LoadError("the tokenizer's ids are not contiguous; it cannot be written as a GGUF vocabulary")
    types = [_NORMAL] * n
    for i, added in tokenizer.backend.get_added_tokens_decoder().items():
        types[i] = _CONTROL if added.special else _USER_DEFINED
    tokens += [f"[PAD{i}]" for i in range(n, vocab_size)]
    types += [_UNUSED] * (vocab_size - n)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model.get("merges", [])]
    if not merges:
        # llama.cpp refuses a BPE vocabulary without merges and GGUF cannot hold an empty
        # array: write one merge that never applies (BPE starts from single characters, and
        # with no other merges nothing ever forms a multi-character symbol to merge).
        long = [t for t in tokens[:n] if len(t) > 1 and " " not in t]
        if len(long) < 2:
            raise LoadError("a BPE tokenizer with no merges needs two multi-character tokens to export")
        merges = [f"{long[0]} {long[1]}"]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre or pre_tokenizer_name(backend_json)}


def export_gguf(model, path: str, *, dtype: str = "F32", pre: str | None = None) -> str:
    """Write `model` (a LoadedModel, a built-in name, a folder or a GGUF file) to `path`."""
    m = model if isinstance(model, LoadedModel) else load_model(model)
    cfg = m.config
    arch = m.raw_config.get("model_type")
    if arch not in _ARCHES:
        raise UnsupportedArchitecture(f"GGUF export supports {', '.join(_ARCHES)}, not {arch!r}")
    if dtype not in ("F32", "F16"):
        raise ValueError(f"dtype must be F32 or F16, not {dtype!r}")
    if m.raw_config.get("rope_scaling"):
        raise UnsupportedArchitecture("GGUF export of rope scaling is not supported")
    tok = tokenizer_metadata(m.tokenizer, cfg.vocab_size, pre)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(m.name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "F32" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(int(m.raw_config.get("max_position_embeddings", 2048)))
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    t = m.tokenizer
    if t.bos_token_id is not None:
        w.add_bos_token_id(int(t.bos_token_id))
    if t.eos_token_ids:
        w.add_eos_token_id(int(t.eos_token_ids[0]))
    w.add_add_bos_token(bool(t.add_bos_token))
    if t.chat_template:
        w.add_chat_template(t.chat_template)
    for name, tensor in m.weights.items():
        a = tensor.detach().to(torch.float32)
        if arch == "llama" and ".self_attn.q_proj." in name:
            a = permute_rows(a, cfg.num_attention_heads)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            a = permute_rows(a, cfg.num_key_value_heads)
        arr = np.ascontiguousarray(a.numpy())
        if dtype == "F16" and arr.ndim == 2:
            arr = arr.astype(np.float16)
        w.add_tensor(gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def exported_gguf(name_or_path: str, dtype: str = "F32") -> str:
    """The model exported to GGUF once and kept in the model cache (keyed by the checkpoint
    folder it came from and that folder's cache key, so a rebuilt model is re-exported)."""
    _, folder = checkpoint_folder(name_or_path)
    key_file = os.path.join(folder, "cache_key.json")
    ident = open(key_file).read() if os.path.isfile(key_file) else json.dumps(
        {p: os.stat(os.path.join(folder, p)).st_mtime_ns for p in sorted(os.listdir(folder))})
    digest = hashlib.sha256(f"{EXPORT_VERSION}\n{dtype}\n{os.path.realpath(folder)}\n{ident}".encode()).hexdigest()[:16]
    out_dir = os.path.join(cache_root(), "gguf-export")
    final = os.path.join(out_dir, f"{os.path.basename(os.path.normpath(folder))}-{dtype.lower()}-{digest}.gguf")
    if os.path.isfile(final):
        return final
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".gguf", dir=out_dir)
    os.close(fd)
    try:
        export_gguf(folder, tmp, dtype=dtype)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)  # atomic: a concurrent export of the same model writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final
