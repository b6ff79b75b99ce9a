"""Test helpers: tiny random models of each family as transformers builds them, a tiny byte-level
BPE vocabulary, writers for checkpoint folders and for GGUF files laid out as llama.cpp's
converter lays them out, and a slow pure-Python reference BPE encoder."""

from __future__ import annotations

import json
import os

import numpy as np
import regex
import torch

from tests.helpers.hf_parity import randomise_norms_and_biases

FAMILIES = ("llama", "qwen2", "qwen3")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes (written out from its definition)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "o r", "l l", "Ġw or", "l d"]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of a 3 + 256 + 12 token byte-level BPE vocabulary."""
    tokens = list(SPECIALS) + [bytes_to_unicode()[b] for b in range(256)]
    for m in TINY_MERGES:
        tokens.append(m.replace(" ", ""))
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, list(TINY_MERGES), types


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def hf_config(family: str, *, tie: bool = True, vocab: int = 271, layers: int = 2) -> dict:
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    cfg = {
        "architectures": [cls], "model_type": family, "vocab_size": vocab, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "tie_word_embeddings": tie, "bos_token_id": 0, "eos_token_id": 2,
        "hidden_act": "silu",
    }
    if family == "qwen2":
        cfg["use_sliding_window"] = False
    if family == "qwen3":
        cfg["attention_bias"] = False
    return cfg


def transformers_model(config: dict, seed: int = 0, dtype=torch.float32):
    """A transformers model of `config` with random weights (norms and biases randomised too,
    so a mix-up of any two tensors shows)."""
    import transformers
    cfg_cls = getattr(transformers, config["architectures"][0].replace("ForCausalLM", "Config"))
    model_cls = getattr(transformers, config["architectures"][0])
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{k: v for k, v in config.items() if k != "architectures"})).to(dtype).eval()
    randomise_norms_and_biases(model, 0.1)
    return model


def engine_weights(model) -> dict[str, torch.Tensor]:
    """The state dict a loader should return: without the tied lm_head."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def tiny_tokenizer_json(path: str) -> None:
    """Write tokenizer.json / tokenizer_config.json for the tiny vocabulary."""
    from tokenrouter.runtime.loader.gguf_tokenizer import tokenizer_from_gguf
    tokens, merges, types = tiny_vocab()
    tok = tokenizer_from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
                               "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
                               "tokenizer.ggml.token_type": types, "tokenizer.ggml.eos_token_id": 2,
                               "tokenizer.chat_template": CHATML})
    tok.save(path)


def write_hf_folder(path: str, model, config: dict) -> None:
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(path, "model.safetensors"))
    tiny_tokenizer_json(path)


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k permutation, written out from its description: split
    each head's rows into two halves and interleave them."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: str, model, config: dict, *, qtype: str = "F32", arch: str | None = None,
               pre: str = "gpt2", tokenizer_model: str = "gpt2", odd_tensor: str | None = None) -> None:
    """Write `model` as llama.cpp would: its names, its q/k permutation (Llama only), matrices
    quantised to `qtype` (norms stay F32; a callable: each matrix's type from its GGUF name).
    `odd_tensor` stores that tensor as int32 instead."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    family = config["model_type"]
    arch = arch or family
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_dimension_count(config["head_dim"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_vocab_size(config["vocab_size"])
    tokens, merges, types = tiny_vocab()
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        a = t.detach().float().numpy().copy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{layer}.{_GGUF_NAMES[rest]}"
        if family == "llama" and rest_is(name, "q_proj"):
            a = _llamacpp_permute(a, config["num_attention_heads"])
        elif family == "llama" and rest_is(name, "k_proj"):
            a = _llamacpp_permute(a, config["num_key_value_heads"])
        if odd_tensor == name:
            w.add_tensor(gname, a.astype(np.int32), raw_dtype=Q.I32)
        elif a.ndim == 2 and (callable(qtype) or qtype != "F32"):
            # "Q4_K_M": Q4_K, with v and down projections in Q6_K, as llama.cpp's mixes do; a
            # callable gives each tensor's type by its GGUF name (a mix such as Qwen's own files)
            kind = qtype(gname) if callable(qtype) else \
                "Q6_K" if qtype == "Q4_K_M" and gname.endswith(("attn_v.weight", "ffn_down.weight")) else \
                "Q4_K" if qtype == "Q4_K_M" else qtype
            q = getattr(Q, kind)
            w.add_tensor(gname, K_QUANTIZERS[kind](a) if kind in K_QUANTIZERS else quantize(a, q), raw_dtype=q)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """A [n, k] float matrix as Q4_K blocks (the `gguf` package reads them but cannot write
    them): per 256 weights fp16 d, dmin; 8 sub-blocks of 32 with 6-bit scale and min
    (w = d sc q - dmin m, q in 0..15); codes of sub-blocks 2i / 2i+1 in one byte's low / high
    nibble. A plain min/max recipe, not llama.cpp's search: only the layout must be right."""
    n, k = a.shape
    g = a.astype(np.float32).reshape(-1, 8, 32)  # [blocks, sub-block, 32]
    mins = np.maximum(-g.min(-1), 0.0)  # w = d1 q - m1 with m1 >= 0
    d1 = np.maximum((g.max(-1) + mins) / 15.0, 1e-8)
    d = (d1.max(-1, keepdims=True) / 63.0).astype(np.float16)
    dmin = (np.maximum(mins.max(-1, keepdims=True), 1e-8) / 63.0).astype(np.float16)
    sc = np.clip(np.round(d1 / d.astype(np.float32)), 1, 63).astype(np.uint8)
    m = np.clip(np.round(mins / dmin.astype(np.float32)), 0, 63).astype(np.uint8)
    step = d.astype(np.float32) * sc
    q = np.clip(np.round((g + (dmin.astype(np.float32) * m)[..., None]) / step[..., None]), 0, 15).astype(np.uint8)
    scales = np.empty((g.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], axis=1)
    return blocks.reshape(n, k // 256 * 144)


def quantize_q6_k(a: np.ndarray) -> np.ndarray:
    """A [n, k] float matrix as Q6_K blocks: per 256 weights 128 bytes of low nibbles, 64 of
    high bit pairs, 16 int8 scales (one per 16 weights) and fp16 d; w = d sc (q - 32)."""
    n, k = a.shape
    g = a.astype(np.float32).reshape(-1, 16, 16)
    s = np.maximum(np.abs(g).max(-1) / 31.0, 1e-8)
    d = (s.max(-1, keepdims=True) / 127.0).astype(np.float16)
    sc = np.clip(np.round(s / d.astype(np.float32)), 1, 127).astype(np.int8)
    step = d.astype(np.float32) * sc
    q = (np.clip(np.round(g / step[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4),
                         (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    blocks = np.concatenate([ql, qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1)
    return blocks.reshape(n, k // 256 * 210)


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}


def rest_is(name: str, proj: str) -> bool:
    return f".self_attn.{proj}." in name


# -- an independent, slow reference of byte-level BPE as llama.cpp runs it for "smollm" ----------

_GPT2_SPLIT = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")


def reference_encode(text: str, tokens: list[str], merges: list[str], specials: list[str],
                     split_digits: bool = True) -> list[int]:
    """Split out special tokens, then (for "smollm") isolate every digit, then GPT-2's regex,
    then merge each piece's bytes by merge rank."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    spell = bytes_to_unicode()
    special_re = regex.compile("(" + "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
    ids: list[int] = []
    for chunk in special_re.split(text):
        if not chunk:
            continue
        if chunk in specials:
            ids.append(vocab[chunk])
            continue
        parts = regex.split(r"(\p{N})", chunk) if split_digits else [chunk]
        for part in parts:
            for piece in _GPT2_SPLIT.findall(part):
                symbols = [spell[b] for b in piece.encode("utf-8")]
                while len(symbols) > 1:
                    best = min(range(len(symbols) - 1),
                               key=lambda i: ranks.get((symbols[i], symbols[i + 1]), float("inf")))
                    if (symbols[best], symbols[best + 1]) not in ranks:
                        break
                    symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
                ids.extend(vocab[s] for s in symbols)
    return ids


def largest_logit_gap(ref, eng, prompts: list[list[int]], decodes: int) -> float:
    """The largest |logit difference| between two engines over a prefill of `prompts` and
    `decodes` greedy steps on `ref`'s tokens."""
    a = ref.step([(i, x) for i, x in enumerate(prompts)]).logits
    b = eng.step([(i, x) for i, x in enumerate(prompts)]).logits
    gap = float((a - b).abs().max())
    for _ in range(decodes):
        nxt = a.argmax(-1).tolist()
        a = ref.step([(i, [t]) for i, t in enumerate(nxt)]).logits
        b = eng.step([(i, [t]) for i, t in enumerate(nxt)]).logits
        gap = max(gap, float((a - b).abs().max()))
    return gap
