"""Tiny random-weight models of each family the engine runs, built with `transformers` (the
oracle of the logit-parity tests), in float64."""

from __future__ import annotations

import torch

from tokenrouter.runtime.engine.config import ModelConfig

FAMILIES = ["llama", "llama_tied_llama3rope", "qwen2", "qwen3"]


def rms_norm_f64(self, x):
    """The same RMSNorm as HF's, without the float32 round trip (so float64 parity is tight)."""
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def build_hf(family: str, seed: int = 0, **over):
    """An HF causal LM with random weights (norms and biases randomised too) in float64."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.15, rms_norm_eps=1e-6, attn_implementation="sdpa")
    common.update(over)
    if family == "llama":
        cfg = tf.LlamaConfig(**common, rope_theta=10000.0)
        cls = tf.LlamaForCausalLM
    elif family == "llama_tied_llama3rope":
        cfg = tf.LlamaConfig(**common, tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=16))
        cls = tf.LlamaForCausalLM
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common, rope_theta=1000000.0)
        cls = tf.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = tf.Qwen3Config(**common, head_dim=24, rope_theta=1000000.0)
        cls = tf.Qwen3ForCausalLM
    else:
        raise ValueError(family)
    model = cls(cfg).double().eval()
    for mod in model.modules():  # HF's RMSNorm computes in float32 even for float64 inputs
        if type(mod).__name__.endswith("RMSNorm"):
            mod.forward = rms_norm_f64.__get__(mod)
    randomise_norms_and_biases(model, 0.2)
    d = cfg.to_dict()
    d["architectures"] = [cls.__name__]
    return model, ModelConfig.from_hf(d)


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of one full forward [L, V] (float64)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def randomise_norms_and_biases(model, scale: float) -> None:
    """Norm weights 1 + scale * N(0, 1), biases scale * N(0, 1): transformers initialises them
    to 1 and 0, which would hide a norm or bias applied to the wrong tensor."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + scale * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(scale * torch.randn_like(p))
