"""The decoder of the Llama family (Llama, Qwen2, Qwen3) over a flat batch of tokens.

One class covers the three architectures: they differ only in flags of `ModelConfig`
(Qwen2: q/k/v biases; Qwen3: per-head RMSNorm on q and k; tied embeddings anywhere).
Weights come as a Hugging Face-named state dict, held in the model's format (`weights.py`);
q/k/v and gate/up are fused into one matrix each so a layer costs four matrix multiplies,
and each q/k head's rows are stored interleaved so rotary embedding is one in-place complex
multiply (`layers.Rotary`). The forward takes the batch and the KV cache explicitly, so
several models can live in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.attention import AttnMeta, paged_attention
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.kv_cache import KVCache
from tokenrouter.runtime.engine.layers import LinearWeight, Rotary, interleave, linear, rms_norm, silu_mul
from tokenrouter.runtime.engine.stack import build_stack, segments
from tokenrouter.runtime.kernels import bindings
from tokenrouter.runtime.kernels.build import available
from tokenrouter.runtime.engine.weights import (CODED, WeightError, check_formats, embedding_codes, map_rows,
                                                matrix_format, quantised_head, reader)
from tokenrouter.runtime.kernels.blocks import GGML_TYPES, BlockRows
from tokenrouter.runtime.kernels.linear import C_INT_KERNELS, INT_KERNELS, PlannedLinear, PlannedParts
from tokenrouter.runtime.kernels.quant import QuantTensor


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
                 device: torch.device | str, dtype: torch.dtype, max_len: int, quant: str = "none",
                 act_dtype: torch.dtype = torch.bfloat16, head_quant: str = "auto"):
        """The weights held in format `quant`, the LM head in `head_quant` (`weights.py` says
        what each format holds)."""
        c = config
        check_formats(quant, head_quant, device)
        self.config = c
        self.quant = quant
        self.dtype = dtype
        self.nh, self.kvh, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if self.nh % self.kvh:
            raise WeightError(f"{self.nh} attention heads do not divide into {self.kvh} KV heads")
        get = reader(weights, quant, dtype, device)
        matrix = matrix_format(quant, dtype, act_dtype, device)
        self._init_head(get, matrix, head_quant, act_dtype)
        self.layers: list[_Layer] = [self._layer(get, matrix, i) for i in range(c.num_hidden_layers)]
        scaling = dict(c.rope_scaling) if c.rope_scaling else None
        self.rotary = Rotary(self.hd, c.rope_theta, scaling, max_len, device, dtype)
        self.scale = self.hd ** -0.5
        self.fused = False  # the C element-wise path (`fused_problem`, `_fused_layers`); the engine sets it
        self.stacked = False  # decode steps as one C call (`stack.py`); the engine sets it
        self._stack: tuple | None = None  # (the cache it was built over, its DecodeStack)
        self.stack_steps = 0  # forwards run as stack calls
        self.act_dtype = act_dtype
        self._fused_dtype: torch.dtype | None = None  # `fused_input_dtype`, once known
        # called before each layer (before each run of `HOOK_LAYERS` on the stacked path): a
        # subserver that shares the host's cores re-reads its share there (`runtime/cores.py`)
        self.between_layers = None

    def _init_head(self, get, matrix, head_quant: str, act_dtype: torch.dtype) -> None:
        """The embedding, the final norm and the LM head: in a float model as the checkpoint
        gives them; in a quantised one the head in `head_quant` and the embedding as codes
        where it can be (`weights.embedding_codes`)."""
        c, h = self.config, self.config.hidden_size
        embed = get("model.embed_tokens.weight", (c.vocab_size, h), blocks=True)
        self.norm = get("model.norm.weight", (h,))
        head = get("lm_head.weight", (c.vocab_size, h), optional=c.tie_word_embeddings, blocks=True)
        self.embed_q: QuantTensor | BlockRows | None = None  # the embedding as codes (rows dequantised on lookup)
        self.head_exact: QuantTensor | BlockRows | None = None
        if self.quant == "none":
            self.embed_tokens = embed
            self.lm_head = matrix([embed if head is None else head], "lm_head.weight")
            return
        head_w, own = quantised_head(embed if head is None else head, head_quant)
        self.embed_q = embedding_codes(embed, head, head_w)
        self.embed_tokens = None if self.embed_q is not None else embed
        # a head held coarser than the codes it comes from (the tied embedding's, or its own):
        # rescore its top candidates exactly from those codes (`logits`)
        exact = self.embed_q if head is None else head
        if not own and isinstance(exact, CODED) and exact is not head_w:
            self.head_exact = exact
        self.lm_head = PlannedLinear(head_w, act_dtype, rescored=self.head_exact is not None)

    def _layer(self, get, matrix, i: int) -> _Layer:
        """Decoder layer `i`: q/k/v and gate/up fused, q and k rows interleaved per head."""
        c, nh, kvh = self.config, self.nh, self.kvh
        h, inter = c.hidden_size, c.intermediate_size
        q_out, kv_out = nh * self.hd, kvh * self.hd
        p = f"model.layers.{i}."
        a = p + "self_attn."
        qb = get(a + "q_proj.bias", (q_out,), optional=not c.attention_bias)
        kb = get(a + "k_proj.bias", (kv_out,), optional=qb is None)
        vb = get(a + "v_proj.bias", (kv_out,), optional=qb is None)
        if qb is not None:
            qb, kb = interleave(qb, nh), interleave(kb, kvh)
        return _Layer(
            ln1=get(p + "input_layernorm.weight", (h,)),
            qkv=matrix([map_rows(get(a + "q_proj.weight", (q_out, h)), lambda t: interleave(t, nh)),
                        map_rows(get(a + "k_proj.weight", (kv_out, h)), lambda t: interleave(t, kvh)),
                        get(a + "v_proj.weight", (kv_out, h))], a + "q_proj+k_proj+v_proj.weight"),
            qkv_bias=None if qb is None else torch.cat([qb, kb, vb]),
            qk_norm=self._qk_norm(get(a + "q_norm.weight", (self.hd,), optional=not c.qk_norm),
                                  get(a + "k_norm.weight", (self.hd,), optional=not c.qk_norm)),
            o=matrix([get(a + "o_proj.weight", (h, q_out))], a + "o_proj.weight"),
            o_bias=get(a + "o_proj.bias", (h,), optional=True),
            ln2=get(p + "post_attention_layernorm.weight", (h,)),
            gate_up=matrix([get(p + "mlp.gate_proj.weight", (inter, h)), get(p + "mlp.up_proj.weight", (inter, h))],
                           p + "mlp.gate_proj+up_proj.weight"),
            down=matrix([get(p + "mlp.down_proj.weight", (h, inter))], p + "mlp.down_proj.weight"),
        )

    def _qk_norm(self, qn: torch.Tensor | None, kn: torch.Tensor | None) -> torch.Tensor | None:
        if qn is None or kn is None:
            return None
        return torch.cat([interleave(qn, 1).expand(self.nh, -1), interleave(kn, 1).expand(self.kvh, -1)])

    def linears(self) -> list:
        """The matrices whose kernels are chosen by measurement (`PlannedLinear`): a
        quantised model's, and a float32 model's on CPU; none in float64 or on other devices."""
        return [m for m in (self.lm_head, *self.decoder_linears()) if not isinstance(m, LinearWeight)]

    def decoder_linears(self) -> list:
        """The decoder's planned matrices, a fused matrix's parts each on their own."""
        mats = [m for ly in self.layers for m in (ly.qkv, ly.o, ly.gate_up, ly.down)]
        return [p for m in mats for p in (m.parts if isinstance(m, PlannedParts) else (m,))]

    def fused_problem(self) -> str | None:
        """Why `_fused_layers` cannot run this model, or None. It needs a quantised model on
        CPU in float32 whose every decoder matrix (the LM head may be float) runs an integer
        kernel, and the C kernels built here."""
        if self.quant == "none":
            return "the model is not quantised (quant=none keeps torch's exact float path)"
        if self.dtype != torch.float32:
            return f"it runs float32 models, not {self.dtype}"
        if self.rotary.cis.device.type != "cpu":
            return "it runs on CPU"
        floats = sorted({lin.key for lin in self.decoder_linears() for _, k in lin.plan if k not in INT_KERNELS})
        if floats:
            return f"matrices {', '.join(floats)} run a float kernel on this host"
        return available()

    def fused_input_dtype(self) -> torch.dtype:
        """The dtype the fused path hands the decoder's products: float32 where every one runs a
        C kernel (they take float32 and round it themselves: `int4avx2` to ~15 bits, finer than
        bfloat16, and no cast is needed), else `act_dtype` (torch's kernels compute in it)."""
        kernels = {k for lin in self.decoder_linears() for _, k in lin.plan}
        return torch.float32 if kernels <= set(C_INT_KERNELS) else self.act_dtype

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_q is not None:
            return self.embed_q.dequantize(token_ids, self.dtype)
        return self.embed_tokens[token_ids]

    HOOK_LAYERS = 4  # layers of one stack call between two `between_layers` calls

    RESCORE = 16  # top candidates of a requantised head recomputed exactly

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head on final-normed hidden states [n, H] -> [n, V].

        When the head is held coarser than the file gives it (SmolLM2's Q8_0 embedding as int4
        or int8), its `RESCORE` highest logits per row are recomputed in float32 from the
        file's own codes: those rows cost nothing next to the whole head, and the greedy token
        (and the top of the distribution) is then the file's own whenever it is among them."""
        lg = linear(h, self.lm_head)
        e, k = self.head_exact, min(self.RESCORE, lg.shape[1])
        if e is not None and self._c_rescore(lg, h):
            if isinstance(e, BlockRows):
                bindings.rescore_top_blocks(lg, h, GGML_TYPES[e.kind][0], e.data, k)
            else:
                bindings.rescore_top(lg, h, e.codes, e.scale, k)
        elif e is not None:
            n = h.shape[0]
            top = lg.topk(k, dim=-1).indices  # [n, k]
            w = e.dequantize(top.reshape(-1)).view(n, k, -1)
            # a product and a sum per row, not `bmm`: its result for one row depends on how many
            # rows share the call, which would make a request's logits depend on its batch
            exact = (w * h.to(torch.float32).unsqueeze(1)).sum(-1)
            lg.scatter_(1, top, exact.to(lg.dtype))
        return lg

    def _c_rescore(self, lg: torch.Tensor, h: torch.Tensor) -> bool:
        """Whether `logits` rescores in C (`csrc/head_rescore.c`: one pass a row, where torch
        takes six ops a step): float32 logits and states on CPU, int8 codes with float32
        scales, the C kernels built here. Its sums run in index order, torch's vectorised: the
        rescored logits differ between the two by float32 rounding."""
        e = self.head_exact
        return (lg.dtype == torch.float32 and h.dtype == torch.float32 and lg.device.type == "cpu"
                and (isinstance(e, BlockRows) or (e.codes.dtype == torch.int8 and e.scale.dtype == torch.float32
                                                  and e.scale.dim() == 2))
                and available() is None)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMeta, kv: KVCache,
                last_rows: torch.Tensor, hidden_layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run the decoder over T flat tokens, writing their K/V into `kv`.

        Returns the final-normed hidden state at `last_rows` [n, H] (the LM head's input)
        and {layer: [n, H]} for the requested layers (0 = embeddings, i = after layer i,
        -1 = after the final norm). The layers run on torch's ops, or, in a quantised model,
        with their element-wise work in C (`fused`, `_fused_layers`)."""
        want = set(hidden_layers)
        hidden: dict[int, torch.Tensor] = {}
        h = self.embed(token_ids)
        if 0 in want:
            hidden[0] = h[last_rows]
        layers = self._fused_layers if self.fused else self._torch_layers
        h = layers(h, positions, meta, kv, last_rows, want, hidden)
        last = rms_norm(h[last_rows], self.norm, self.config.rms_norm_eps)
        if -1 in want:
            hidden[-1] = last
        return last, hidden

    def _torch_layers(self, h: torch.Tensor, positions: torch.Tensor, meta: AttnMeta, kv: KVCache,
                      last_rows: torch.Tensor, want: set[int], hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """The decoder layers on torch's ops; the hidden state after each layer in `want` goes
        into `hidden`. Returns the last layer's output."""
        eps = self.config.rms_norm_eps
        cis = self.rotary.tables(positions)
        t = h.shape[0]
        nqk = self.nh + self.kvh
        hook = self.between_layers
        for i, ly in enumerate(self.layers):
            if hook is not None:
                hook()
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
        return h

    def _fused_layers(self, h: torch.Tensor, positions: torch.Tensor, meta: AttnMeta, kv: KVCache,
                      last_rows: torch.Tensor, want: set[int], hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """`_torch_layers` for a quantised model, with the element-wise work between the matrix
        products in C (`kernels.bindings`, `csrc/decode_ops.c`): per layer four integer-kernel products,
        RoPE and the K/V write in one call, attention, SwiGLU, and two calls that add the
        residual and normalise into the next product's input (in `act_dtype`, which the integer
        kernels compute in). The residual stream stays float32, updated in place; the results
        differ from torch's ops by float rounding only (other reduction order in the norms,
        another exp in SwiGLU), row by row, so batch invariance holds."""
        eps = self.config.rms_norm_eps
        if not h.is_contiguous():
            h = h.contiguous()
        t, width = h.shape
        cis = torch.view_as_real(self.rotary.cis)
        if self.stacked and not meta.groups and meta.native is not None:  # every token on the C attention
            return self._stack_layers(h, cis, positions, meta, kv, last_rows, want, hidden)
        if self._fused_dtype is None:  # the plans are fixed once the engine chose them
            self._fused_dtype = self.fused_input_dtype()
        act_dtype = self._fused_dtype
        x = h.new_empty(t, width, dtype=act_dtype)
        q = h.new_empty(t, self.nh, self.hd)
        act = None
        bindings.add_rmsnorm(h, None, self.layers[0].ln1, eps, x)
        hook = self.between_layers
        for i, ly in enumerate(self.layers):
            if hook is not None:
                hook()
            first = i == 0  # every layer's tensors have the first's shapes: check those once
            qkv = ly.qkv(x, ly.qkv_bias)  # in act_dtype (float32 with a bias added)
            bindings.rope_write(qkv, self.nh, self.kvh, cis, positions, ly.qk_norm, eps, kv.layers[i], meta.slot_mapping,
                          q.view(t, -1), check=first)
            o = paged_attention(q, kv, i, meta, self.scale)
            bindings.add_rmsnorm(h, ly.o(o.to(act_dtype), ly.o_bias), ly.ln2, eps, x, check=first)
            gu = ly.gate_up(x)
            if act is None:
                act = gu.new_empty(t, gu.shape[1] // 2)
            bindings.silu_mul(gu, act, check=first)
            nxt = self.layers[i + 1].ln1 if i + 1 < len(self.layers) else None
            bindings.add_rmsnorm(h, ly.down(act), nxt, eps, None if nxt is None else x, check=first or nxt is None)
            if i + 1 in want:
                hidden[i + 1] = h[last_rows]
        return h

    def _stack_layers(self, h: torch.Tensor, cis: torch.Tensor, positions: torch.Tensor, meta: AttnMeta, kv: KVCache,
                      last_rows: torch.Tensor, want: set[int], hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """`_fused_layers` as one C call for the layers between two wanted hidden states (`stack.py`):
        the same calls in the same order, so the same bits."""
        if self._stack is None or self._stack[0] is not kv:
            self._stack = (kv, build_stack(self, kv))
        n = meta.native
        self.stack_steps += 1
        hook = self.between_layers
        cut = set(range(self.HOOK_LAYERS, len(self.layers), self.HOOK_LAYERS)) if hook is not None else set()
        for l0, l1 in segments(len(self.layers), want | cut):
            if hook is not None:
                hook()
            self._stack[1].run(h, l0, l1, cis, positions, meta.slot_mapping, n.tables, n.rows, n.reqs, n.lens)
            if l1 in want:
                hidden[l1] = h[last_rows]
        return h
