"""Tiny random-weight checkpoints and routing programs for the tests (runtime, bench, eval, fit, tuner).

Models are written as Hugging Face checkpoint folders (config.json, safetensors, a
byte-level tokenizer.json built with `tokenizers`), so they go through the real loader.
Weights are drawn with a larger spread than an initialiser would use, so next-token
distributions vary from peaked to flat and entropy rules actually fire. Programs are
written in float64 so greedy decisions never hinge on rounding.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tokenizer_models

from tests.helpers import REPO
from tokenrouter.compiler import ir
from tokenrouter.compiler.weights import nets as router_nets
from tokenrouter.compiler.pipeline import load_program
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.loader import model_facts
from tokenrouter.runtime.loader.hf import expected_shapes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS = 2
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tokenizer(folder: str) -> int:
    """A byte-level BPE with no merges: 3 special tokens + 256 bytes. Returns the vocab size."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}, f)
    return len(vocab)


def write_model(folder: str, *, layers: int, hidden: int, seed: int, heads: int = 4, kv_heads: int = 2,
                family: str = "llama", scale: float = 0.35, max_len: int = 512) -> str:
    os.makedirs(folder, exist_ok=True)
    vocab = write_tokenizer(folder)
    hd = hidden // heads
    inter = hidden * 2
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    cfg = {"architectures": [arch], "model_type": family, "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": hd, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": max_len, "tie_word_embeddings": False, "bos_token_id": 0,
           "eos_token_id": EOS, "hidden_act": "silu"}
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=scale):
        return (torch.randn(*shape, generator=g) * s / max(1.0, shape[-1] ** 0.5) * 4).float().contiguous()

    w = {"model.embed_tokens.weight": rnd(vocab, hidden, s=1.0),
         "model.norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
         "lm_head.weight": rnd(vocab, hidden, s=1.5)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
        w[p + "self_attn.q_proj.weight"] = rnd(heads * hd, hidden)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * hd, hidden)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * hd, hidden)
        w[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * hd)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
        if family == "qwen2":
            for n, d in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = 0.1 * torch.randn(d, generator=g)
        if family == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=g)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=g)
    save_file({k: v.float().contiguous() for k, v in w.items()}, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def make_pair(root: str) -> dict[str, str]:
    """A small and a large model sharing the tiny vocabulary."""
    return {"slm": write_model(os.path.join(root, "slm"), layers=2, hidden=32, seed=1),
            "llm": write_model(os.path.join(root, "llm"), layers=3, hidden=48, seed=2, family="qwen2")}


def pair_with_tokenizer_config(pair: dict[str, str], root, config: dict | None) -> dict[str, str]:
    """The pair's folders copied under `root` (one folder per model, by its name), each with
    `config` as its tokenizer_config.json (a chat template, special tokens), or with none when
    `config` is None (a model without a chat template)."""
    out = {}
    for name, folder in pair.items():
        out[name] = str(shutil.copytree(folder, os.path.join(root, name),
                                        ignore=shutil.ignore_patterns("tokenizer_config.json")))
        if config is not None:
            with open(os.path.join(out[name], "tokenizer_config.json"), "w") as f:
                json.dump(config, f)
    return out


# ------------------------------------------------------------------ programs

def rstitch(paths: dict[str, str], tau: float, dtype: str = "float64", **schedule) -> ir.Program:
    """R-Stitch: small -> large when the small model is unsure (rewrite); back when the
    large model's own token is confident (keep)."""
    return ir.Program(
        source="<test:rstitch>", language_version=1,
        models=(ir.Model("slm", paths["slm"], "small", dtype), ir.Model("llm", paths["llm"], "large", dtype)),
        start="slm",
        transitions=(
            ir.Transition("slm", "llm", ir.Compare(">", ir.Entropy("slm", True), ir.Const(tau)), "rewrite"),
            ir.Transition("llm", "slm", ir.Compare("<=", ir.Entropy("llm", True), ir.Const(tau)), "keep"),
        ),
        schedule=ir.Schedule(**schedule))


def coin(paths: dict[str, str], p: float, dtype: str = "float64", **schedule) -> ir.Program:
    """R2R-shaped with a seeded coin: small -> large with probability p (rewrite), large writes
    one token and returns (keep)."""
    return ir.Program(
        source="<test:coin>", language_version=1,
        models=(ir.Model("slm", paths["slm"], "small", dtype), ir.Model("llm", paths["llm"], "large", dtype)),
        start="slm",
        transitions=(ir.Transition("slm", "llm", ir.Bernoulli(p, 7), "rewrite"),),
        bounds=(ir.VisitBound("llm", 1, 1, "slm"),),
        schedule=ir.Schedule(**schedule))


def ensemble(paths: dict[str, str], dtype: str = "float64") -> ir.Program:
    """One writer averaging both models' distributions."""
    return ir.Program(
        source="<test:ensemble>", language_version=1,
        models=(ir.Model("slm", paths["slm"], "member", dtype), ir.Model("llm", paths["llm"], "member", dtype)),
        start="avg",
        ensembles=(ir.Ensemble("avg", ("slm", "llm"), (0.6, 0.4), "average", 8),))


# ------------------------------------------------------------------ examples

EXAMPLES = str(REPO / "examples")


def _random_mlp(path: str, width: int, hidden: int, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    save_file({"layers.0.weight": torch.randn(hidden, width, generator=g) * scale / width ** 0.5,
               "layers.0.bias": torch.randn(hidden, generator=g) * 0.1,
               "layers.1.weight": torch.randn(1, hidden, generator=g) * 3.0 / hidden ** 0.5,
               "layers.1.bias": torch.zeros(1)}, path)


# The tiny stand-ins' normalised entropies lie around 0.3-0.4, so an entropy threshold
# tuned for real models (demo.route's) may never fire on them; these retune the copy.
TINY_ENTROPY_TAU = {"demo": 0.3}


def example_program(name: str, root: str, paths: dict[str, str], dtype: str = "float64") -> ir.Program:
    """examples/<name>.route pointed at tiny models, with random router and head weights
    written where the file expects them (a copy of the file lives in `root`; its entropy
    thresholds set to TINY_ENTROPY_TAU[name] where given)."""
    os.makedirs(os.path.join(root, "weights"), exist_ok=True)
    dst = os.path.join(root, f"{name}.route")
    shutil.copy(os.path.join(EXAMPLES, f"{name}.route"), dst)
    src = open(dst).read()
    if re.search(r"\bquant\s*=", src):  # the tiny stand-ins are float checkpoints: no GGUF blocks to run
        src = re.sub(r"\bquant\s*=\s*\w+", "", src)
        open(dst, "w").write(src)
    if name in TINY_ENTROPY_TAU:
        # the examples take their entropy threshold as the parameter `tau`: change its default
        src = re.sub(r"^(param tau: float = )[0-9.]+", rf"\g<1>{TINY_ENTROPY_TAU[name]}", src, flags=re.M)
        open(dst, "w").write(src)
    models = re.findall(r"^model (\w+)", src, re.M)
    alias = {"small": "slm", "large": "llm"}
    mp = {m: paths[alias.get(m, m)] for m in models}
    # no weights files yet (the checker reads those that exist): written below
    prog = load_program(dst, model_paths=mp, model_facts=model_facts)
    hidden_of = {}
    for m in prog.models:
        hidden_of[m.name] = json.load(open(os.path.join(m.path, "config.json")))["hidden_size"]
    for i, r in enumerate(prog.routers):
        width = 0
        for inp in r.inputs:
            width += {"hidden": lambda x: x.dim, "token_embedding": lambda x: x.dim,
                      "topk_logits": lambda x: x.k, "scalar": lambda x: 1}[inp.kind](inp)
        path = os.path.join(root, r.file) if not os.path.isabs(r.file) else r.file
        if r.arch == "mlp":
            _random_mlp(path, width, 16, 10 + i, 2.0)
        else:  # the papers' network kinds (compiler/weights/nets.py), with the metadata naming them
            t = router_nets.random_tensors(r, torch.Generator().manual_seed(10 + i), width=16)
            for k in [k for k in t if k.startswith("inputs.")]:
                t[k] = t[k] * 0.05  # the tiny models' top-k logits are large and alike: damp them
            t["out.weight" if r.arch == "r2r" else "layers.2.weight"] *= 4.0  # decisions both ways
            save_file(t, path, metadata=router_nets.arch_metadata(r))
    for rel in re.findall(r'^head \w+ on (\w+) = "([^"]+)"', src, re.M):
        model, f = rel
        g = torch.Generator().manual_seed(99)
        save_file({"weight": torch.randn(hidden_of[model], generator=g) * 0.5, "bias": torch.zeros(1)},
                  os.path.join(root, f))
    prog = load_program(dst, model_paths=mp, model_facts=model_facts)
    models_ = tuple(dataclasses.replace(m, dtype=dtype) for m in prog.models)
    return dataclasses.replace(prog, models=models_)


# ------------------------------------------------------------------ the tuner tests' model

def write_tiny_model(folder: str, hidden: int, layers: int, seed: int) -> str:
    """A tiny random-weight Llama checkpoint folder with a byte-level tokenizer of 257 ids
    (no chat template; weights of spread 0.05, unit norms): the tuner tests' models."""
    os.makedirs(folder, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(alphabet)}}
    tok = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[]))
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
