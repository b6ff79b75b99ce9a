"""The decoder of the Llama family (Llama, Qwen2, Qwen3) over a flat batch of tokens.

One class covers the three architectures: they differ only in flags of `ModelConfig`
(Qwen2: q/k/v biases; Qwen3: per-head RMSNorm on q and k; tied embeddings anywhere).
Weights come as a Hugging Face-named state dict; q/k/v and gate/up are fused into one
matrix each so a layer costs four matrix multiplies, and each q/k head's rows are stored
interleaved so rotary embedding is one in-place complex multiply (`layers.Rotary`). The
forward takes the batch and the KV cache explicitly, so several models can live in one
process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttnMeta, paged_attention
from .config import ModelConfig
from .kv_cache import KVCache
from .layers import LinearWeight, Rotary, interleave, linear, rms_norm, silu_mul


class WeightError(ValueError):
    """A weight is missing or has the wrong shape for the model's config."""


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: LinearWeight
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [heads + kv_heads, head_dim]: q_norm rows then k_norm rows
    o: LinearWeight
    o_bias: torch.Tensor | None
    ln2: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight


class Model:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], *,
                 device: torch.device | str, dtype: torch.dtype, max_len: int):
        c = config
        self.config = c
        self.nh, self.kvh, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if self.nh % self.kvh:
            raise WeightError(f"{self.nh} attention heads do not divide into {self.kvh} KV heads")
        h, inter = c.hidden_size, c.intermediate_size
        q_out, kv_out = self.nh * self.hd, self.kvh * self.hd

        def get(name: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
            w = weights.get(name)
            if w is None:
                if optional:
                    return None
                raise WeightError(f"missing weight {name!r}")
            if tuple(w.shape) != shape:
                raise WeightError(f"weight {name!r} has shape {tuple(w.shape)}, expected {shape}")
            return w.to(device=device, dtype=dtype)

        self.embed_tokens = get("model.embed_tokens.weight", (c.vocab_size, h))
        self.norm = get("model.norm.weight", (h,))
        head = get("lm_head.weight", (c.vocab_size, h), optional=c.tie_word_embeddings)
        self.lm_head = LinearWeight(self.embed_tokens if head is None else head)
        self.layers: list[_Layer] = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qb = get(a + "q_proj.bias", (q_out,), optional=not c.attention_bias)
            kb = get(a + "k_proj.bias", (kv_out,), optional=qb is None)
            vb = get(a + "v_proj.bias", (kv_out,), optional=qb is None)
            if qb is not None:
                qb, kb = interleave(qb, self.nh), interleave(kb, self.kvh)
            self.layers.append(_Layer(
                ln1=get(p + "input_layernorm.weight", (h,)),
                qkv=LinearWeight(torch.cat([interleave(get(a + "q_proj.weight", (q_out, h)), self.nh),
                                            interleave(get(a + "k_proj.weight", (kv_out, h)), self.kvh),
                                            get(a + "v_proj.weight", (kv_out, h))])),
                qkv_bias=None if qb is None else torch.cat([qb, kb, vb]),
                qk_norm=self._qk_norm(get(a + "q_norm.weight", (self.hd,), optional=not c.qk_norm),
                                      get(a + "k_norm.weight", (self.hd,), optional=not c.qk_norm)),
                o=LinearWeight(get(a + "o_proj.weight", (h, q_out))),
                o_bias=get(a + "o_proj.bias", (h,), optional=True),
                ln2=get(p + "post_attention_layernorm.weight", (h,)),
                gate_up=LinearWeight(torch.cat([get(p + "mlp.gate_proj.weight", (inter, h)),
                                                get(p + "mlp.up_proj.weight", (inter, h))])),
                down=LinearWeight(get(p + "mlp.down_proj.weight", (h, inter))),
            ))
        scaling = dict(c.rope_scaling) if c.rope_scaling else None
        self.rotary = Rotary(self.hd, c.rope_theta, scaling, max_len, device, dtype)
        self.scale = self.hd ** -0.5

    def _qk_norm(self, qn: torch.Tensor | None, kn: torch.Tensor | None) -> torch.Tensor | None:
        if qn is None or kn is None:
            return None
        return torch.cat([interleave(qn, 1).expand(self.nh, -1), interleave(kn, 1).expand(self.kvh, -1)])

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens[token_ids]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head on final-normed hidden states [n, H] -> [n, V]."""
        return linear(h, self.lm_head)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMeta, kv: KVCache,
                last_rows: torch.Tensor, hidden_layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run the decoder over T flat tokens, writing their K/V into `kv`.

        Returns the final-normed hidden state at `last_rows` [n, H] (the LM head's input)
        and {layer: [n, H]} for the requested layers (0 = embeddings, i = after layer i,
        -1 = after the final norm)."""
        c = self.config
        eps = c.rms_norm_eps
        want = set(hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        h = self.embed_tokens[token_ids]
        if 0 in want:
            hidden[0] = h[last_rows]
        cis = self.rotary.tables(positions)
        t = h.shape[0]
        nqk = self.nh + self.kvh
        for i, ly in enumerate(self.layers):
            x = rms_norm(h, ly.ln1, eps)
            qkv = linear(x, ly.qkv, ly.qkv_bias).view(t, nqk + self.kvh, self.hd)
            qk = qkv[:, :nqk]
            if ly.qk_norm is not None:  # Qwen3: per-head RMSNorm of q and k, before RoPE
                torch.mul(rms_norm(qk, None, eps), ly.qk_norm, out=qk)
            self.rotary.apply_(qk, cis)  # q and k rotated together, in place
            kv.write(i, meta.slot_mapping, qkv[:, self.nh:])  # k, then v
            o = paged_attention(qkv[:, :self.nh], kv, i, meta, self.scale)
            h = linear(o, ly.o, ly.o_bias, residual=h)
            x = rms_norm(h, ly.ln2, eps)
            h = linear(silu_mul(linear(x, ly.gate_up)), ly.down, residual=h)
            if i + 1 in want:
                hidden[i + 1] = h[last_rows]
        last = rms_norm(h[last_rows], self.norm, eps)
        if -1 in want:
            hidden[-1] = last
        return last, hidden
