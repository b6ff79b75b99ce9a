"""The engine: one model, its paged KV cache, and one forward per step over a mixed batch.

API (what the runtime and the loader call)::

    from tokenrouter.runtime.engine.engine import Engine, StepOutput
    from tokenrouter.runtime.engine.options import EngineOptions
    eng = Engine(config, weights, EngineOptions(dtype=torch.float32, block_size=16, num_blocks=None))
    out = eng.step([(seq_id, new_tokens), ...], needs=FeatureNeeds())
    out.logits          # [B, V] at each request's last new position
    out.hidden          # {layer: [B, H]} for needs.hidden_layers (ir.InputHidden numbering:
                        #  0 = embeddings, n_layers = last layer before the final norm,
                        #  -1 = after the final norm)
    eng.embed(ids)      # [B] -> [B, H] input embeddings (a router feature)
    eng.seq_len(seq_id) # tokens in seq_id's KV cache (0 if unknown)
    eng.can_append(batch) -> bool   # enough free blocks for this step
    eng.free(seq_id)    # release seq_id's blocks (unknown id: no-op)
    eng.fork(parent, child, n)  # child holds parent's first n tokens' KV (shared blocks)
    eng.blocks_used, eng.blocks_total

The options (`EngineOptions`, `options.py`) are named below by their fields.

`step` appends each entry's new tokens to its sequence (a new seq_id starts empty, so a
prefill is an extend from 0 and a decode an extend of one token) and runs the whole batch
as one forward. A sequence holds its blocks until it is freed: appends only ever take free
blocks, so a request pending at a peer keeps its KV without anything more. Long work is
split internally so memory stays bounded: a step computes at most `max_batched_tokens`
tokens per forward; a longer prefill runs its leading chunks
first, and a batch with more tokens runs as several forwards. Results are the same either
way (requests never interact). With `prefix_reuse=True`, a *new* sequence whose prompt
starts with full blocks another sequence computed shares them instead of recomputing.

On CUDA, steps whose requests all add the same few tokens (decode, short extends) replay
CUDA graphs (`graphs.py`, unverified without a GPU; `cuda_graphs=False` turns them off;
`cuda_graphs="eager"` runs their padded static-shape steps without capturing, on any
device, which is how their padding is tested on CPU).

Errors: `BadBatch` (malformed step), `OutOfBlocks` (check `can_append` first), and
`weights.WeightError` (missing or misshapen weights), all with a message for the user.
Threads are the caller's choice (`torch.set_num_threads`); measured on the shared 2-core
machine, two threads per engine collapse when the cores are oversubscribed (two subservers,
or other work), so one thread per engine is the robust setting there.

Matrix kernels: on CPU in float32 every matrix runs the kernels measured fastest on this
host per shape and row count (`kernels/plan.py`; `kernel_plan` forces a kernel name or a
plan, `plan_cache` is where a measured plan is kept, otherwise it is measured at
construction). Quantised weights (`quant="native" | "int4" | "int8"`, see
`kernels/quant.py`): the decoder's
matrices run on int4/int8 kernels with `act_dtype` activations (bfloat16 by default) where
that is faster, float32 where not, one row-invariant kernel per shape. `head_quant` is the
LM head's format in those modes ("auto": int4 where its kernel takes the shape, else int8;
see `Model`).

Attention (`attention`): on CPU in float32, decodes and short extends run a C kernel built
on this host at first use (`kernels/bindings.py`), which reads each request's K/V where it lies in
the cache; prefill chunks, other devices and dtypes run torch's path (`attention.py`).
"torch" forces torch's path everywhere, "native" refuses to run without the C kernel; the
default is `$TOKENROUTER_ATTENTION`, else "auto" (measured on this host, `_native_attention`).

Quantised models run their element-wise work between the matrix products (residual adds,
RMSNorm, casts, RoPE, the K/V write, SwiGLU) as three C calls a layer (`fused_ops`, on by
default where the C kernels build; `Model._fused_layers`).

`num_blocks=None` sizes the cache to a 1 GiB budget (at least one `max_model_len`
sequence); `max_model_len=None` uses the model's `max_position_embeddings`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from tokenrouter.protocol.step import FeatureNeeds

from tokenrouter.runtime.engine.attention import CacheGeometry, build_meta, choice_path, prefer_native
from tokenrouter.runtime.engine.block_allocator import BlockAllocator, OutOfBlocks
from tokenrouter.runtime.engine.config import ModelConfig
from tokenrouter.runtime.engine.graphs import GraphRunner
from tokenrouter.runtime.engine.kv_cache import KV_DTYPES, KVCache, default_num_blocks, half_kv_dtype
from tokenrouter.runtime.engine.model import Model
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.engine.stack import stack_problem
from tokenrouter.runtime.host import cpu_flags
from tokenrouter.runtime.kernels.build import NativeKernelError, available
from tokenrouter.runtime.kernels.plan import choose
from tokenrouter.runtime.memory import release_load_temporaries

__all__ = ["Engine", "StepOutput", "OutOfBlocks", "BadBatch"]

log = logging.getLogger(__name__)


class BadBatch(ValueError):
    """A step's batch is malformed (duplicate ids, empty or out-of-range tokens, too long)."""


@dataclass
class StepOutput:
    logits: torch.Tensor  # [B, V]
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # {layer: [B, H]}


@dataclass
class _Work:
    """One request's share of one forward."""

    index: int  # position in the step's batch; -1 for a leading prefill chunk (no output)
    seq_id: object
    tokens: list[int]
    start: int  # position of tokens[0]
    slots: list[int]


class Engine:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 options: EngineOptions = EngineOptions()):
        o = self.options = options
        self.config = config
        self.device = torch.device(o.device)
        self.dtype = dtype = o.dtype
        self.block_size = block_size = o.block_size
        self.max_model_len = o.max_model_len or config.max_position_embeddings
        self.max_batched_tokens = o.max_batched_tokens
        self.kv_dtype = self._kv_dtype(o.kv_dtype, o.quant, o.act_dtype)
        num_blocks = o.num_blocks
        if num_blocks is None:
            num_blocks = default_num_blocks(config, block_size, self.kv_dtype, self.max_model_len)
        self.model = Model(config, weights, device=self.device, dtype=dtype, max_len=self.max_model_len,
                           quant=o.quant, act_dtype=o.act_dtype, head_quant=o.head_quant)
        self.quant = o.quant
        self.kernel_plans: dict = {}
        if self.model.linears():
            # a float32 model takes the fastest kernel per row count; a quantised one, one
            # row-invariant kernel per shape (kernels/plan.py)
            self.kernel_plans = choose(self.model.linears(), o.kernel_plan, o.plan_cache, per_rows=o.quant == "none")
        self.model.fused = self._fused_ops(o.fused_ops)
        # "eager": the graphs' padded static-shape steps without capturing, on any device (tests)
        use_graphs = o.cuda_graphs == "eager" or (o.cuda_graphs is True and self.device.type == "cuda")
        # with graphs, one extra block past the allocator's range is the padding rows' scratch
        cache_blocks = num_blocks + use_graphs
        self.kv = KVCache(config, cache_blocks, block_size, self.device, self.kv_dtype)
        self.alloc = BlockAllocator(num_blocks, block_size, prefix_reuse=o.prefix_reuse)
        self.q_per_kv = config.num_attention_heads // config.num_key_value_heads
        self.geometry = CacheGeometry(block_size, cache_blocks, config.num_key_value_heads, self.q_per_kv)
        self.native_attention = self._native_attention(o.attention)
        self.model.stacked = self._decode_stack(o.decode_stack)
        self.graphs = None
        if use_graphs:
            self.graphs = GraphRunner(self.model, self.kv, self.geometry, pad_block=num_blocks,
                                      max_len=self.max_model_len, capture=o.cuda_graphs is True)
        release_load_temporaries()

    def _native_attention(self, attention: str) -> bool:
        """Whether decodes and short extends go to the C kernel (`bindings.paged_attention`):
        "native" demands it, "torch" refuses it, "auto" (the default) takes it on CPU in float32
        where it builds and either the model's decode steps can run as one C call (`stack.py`)
        or, measured on this host at this thread count and cache geometry (cached), it is the
        faster. One choice per engine, so every step of a request runs the same arithmetic."""
        if attention is None:
            attention = os.environ.get("TOKENROUTER_ATTENTION", "auto")
        if attention not in ("auto", "native", "torch"):
            raise ValueError(f"attention must be auto, native or torch, not {attention!r}")
        if attention == "torch":
            return False
        fits = self.device.type == "cpu" and self.dtype == torch.float32
        if attention == "native" and not fits:
            raise ValueError(f"attention=native runs on CPU in float32, not {self.device.type}/{self.dtype}")
        if not fits:
            return False
        why = available()
        if why is None:
            if attention == "native" or stack_problem(self.model, True) is None:
                # a model whose decode steps can run as one C call takes the C kernel without
                # timing it: the stack needs it, and it saves more than the two paths differ by
                return True
            c = self.config
            return prefer_native(self.kv, self.geometry, c.num_attention_heads, c.num_hidden_layers,
                                 choice_path(self.geometry, c.num_attention_heads, c.head_dim, c.num_hidden_layers,
                                             self.kv_dtype))
        if attention == "native":
            raise NativeKernelError(f"attention=native: {why}")
        log.warning("C attention kernel unavailable (%s); using torch's attention path", why)
        return False

    def _kv_dtype(self, want: str | None, quant: str, act_dtype: torch.dtype) -> torch.dtype:
        """The cache's element type (`EngineOptions.kv_dtype`): a name as given; None: half
        precision for a quantised float32 model on CPU with half-precision activations (float32
        ones ask for float32's exactness) where the C kernels build (they read and write it; its
        tolerance: `tests/runtime/engine/test_kv_half.py`), else the model's dtype."""
        if want is not None:
            if want not in KV_DTYPES:
                raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)} or None, not {want!r}")
            if KV_DTYPES[want] != self.dtype and (self.device.type != "cpu" or self.dtype != torch.float32):
                raise ValueError(f"kv_dtype={want} runs with float32 models on CPU, not {self.dtype} on {self.device}")
            return KV_DTYPES[want]
        if (quant != "none" and act_dtype != torch.float32 and self.device.type == "cpu" and self.dtype == torch.float32
                and available() is None):
            return half_kv_dtype(cpu_flags())
        return self.dtype

    def _fused_ops(self, want: bool | None) -> bool:
        """Whether a quantised model's element-wise work runs in C (`Model.fused_problem`):
        where it can unless `fused_ops=False`; `True` demands it. No measured choice: it
        replaces ~25 ops a layer by 3 calls, so it cannot lose (`benchmarks/README.md`)."""
        if want is False:
            return False
        why = self.model.fused_problem()
        if why is not None and want:
            raise ValueError(f"fused_ops=True: {why}")
        return why is None

    def _decode_stack(self, want: bool | None) -> bool:
        """Whether decode steps run all layers in one C call (`stack.stack_problem`): where they
        can unless `decode_stack=False`; `True` demands it. The same bits as the fused path, so
        no measured choice."""
        if want is False:
            return False
        why = stack_problem(self.model, self.native_attention)
        if why is not None and want:
            raise ValueError(f"decode_stack=True: {why}")
        return why is None

    # ---- bookkeeping -----------------------------------------------------------------
    @property
    def blocks_used(self) -> int:
        return self.alloc.num_used

    @property
    def blocks_total(self) -> int:
        return self.alloc.num_blocks

    def seq_len(self, seq_id: object) -> int:
        return self.alloc.seq_len(seq_id)

    def can_append(self, batch: list[tuple[object, list[int]]]) -> bool:
        return self.alloc.can_append([(sid, len(toks)) for sid, toks in batch])

    def free(self, seq_id: object) -> None:
        self.alloc.free(seq_id)

    def can_fork(self) -> bool:
        """Whether a fork has the one free block its copy may need."""
        return self.alloc.num_free > 0

    @torch.inference_mode()
    def fork(self, parent: object, child: object, n_tokens: int) -> None:
        """A new sequence `child` whose KV is `parent`'s first n_tokens, without computing
        them: it shares their full blocks (reference counts) and copies the partial one
        (`BlockAllocator.fork`); its next step feeds what comes after them."""
        f = self.alloc.fork(parent, child, n_tokens)
        if f.copy is not None:
            src, dst = f.copy
            self.kv.copy_block(src, dst)

    @torch.inference_mode()
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(token_ids.to(self.device))

    # ---- the step --------------------------------------------------------------------
    def _check(self, batch: list[tuple[object, list[int]]], needs: FeatureNeeds) -> None:
        seen = set()
        v = self.config.vocab_size
        for sid, toks in batch:
            if sid in seen:
                raise BadBatch(f"sequence {sid!r} appears twice in one step")
            seen.add(sid)
            if len(toks) == 0:
                raise BadBatch(f"sequence {sid!r}: no new tokens")
            if min(toks) < 0 or max(toks) >= v:
                raise BadBatch(f"sequence {sid!r}: token id out of range [0, {v})")
            if self.seq_len(sid) + len(toks) > self.max_model_len:
                raise BadBatch(f"sequence {sid!r}: {self.seq_len(sid) + len(toks)} tokens exceed "
                               f"max_model_len {self.max_model_len}")
        n = self.config.num_hidden_layers
        bad = [layer for layer in needs.hidden_layers if not -1 <= layer <= n]
        if bad:
            raise BadBatch(f"hidden layers {bad} out of range [-1, {n}]")
        if not self.can_append(batch):
            raise OutOfBlocks("not enough free KV blocks for this step (check can_append first)")

    def _plan(self, batch: list[tuple[object, list[int]]]) -> list[list[_Work]]:
        """Allocate slots and split the step into forwards of at most max_batched_tokens."""
        cap = self.max_batched_tokens
        lead: list[list[_Work]] = []
        final: list[_Work] = []
        for i, (sid, toks) in enumerate(batch):
            app = self.alloc.append(sid, [int(t) for t in toks])
            todo = list(toks[app.cached:])
            start, slots = app.start + app.cached, app.slots
            while len(todo) > cap:  # leading chunks of a long prefill, one forward each
                lead.append([_Work(-1, sid, todo[:cap], start, slots[:cap])])
                todo, start, slots = todo[cap:], start + cap, slots[cap:]
            final.append(_Work(i, sid, todo, start, slots))
        forwards, cur, used = lead, [], 0
        for w in final:
            if cur and used + len(w.tokens) > cap:
                forwards.append(cur)
                cur, used = [], 0
            cur.append(w)
            used += len(w.tokens)
        forwards.append(cur)
        return forwards

    @torch.inference_mode()
    def step(self, batch: list[tuple[object, list[int]]], needs: FeatureNeeds = FeatureNeeds()) -> StepOutput:
        if not batch:
            raise BadBatch("empty batch")
        self._check(batch, needs)
        layers = tuple(dict.fromkeys(needs.hidden_layers))
        logits = None
        hidden: dict[int, torch.Tensor] = {}
        for works in self._plan(batch):
            last, hid = self._forward(works, layers)
            outs = [w.index for w in works if w.index >= 0]
            if not outs:
                continue
            lg = self.model.logits(last)
            if logits is None:
                if len(outs) == len(batch):  # the usual case: one forward, batch order
                    logits, hidden = lg, hid
                    continue
                logits = lg.new_empty(len(batch), lg.shape[1])
                hidden = {k: t.new_empty(len(batch), t.shape[1]) for k, t in hid.items()}
            idx = torch.tensor(outs, device=self.device)
            logits.index_copy_(0, idx, lg)
            for k, t in hid.items():
                hidden[k].index_copy_(0, idx, t)
        for sid, _ in batch:
            self.alloc.mark_computed(sid)
        return StepOutput(logits=logits, hidden=hidden)

    def _forward(self, works: list[_Work], layers: tuple[int, ...]):
        ids, pos, slots, q_lens, kv_lens, tables = [], [], [], [], [], []
        for w in works:
            ids.extend(w.tokens)
            pos.extend(range(w.start, w.start + len(w.tokens)))
            slots.extend(w.slots)
            q_lens.append(len(w.tokens))
            kv_lens.append(w.start + len(w.tokens))
            tables.append(self.alloc.block_table(w.seq_id))
        if self.graphs is not None and all(w.index >= 0 for w in works):
            res = self.graphs.run(ids, pos, slots, q_lens, kv_lens, tables, layers)
            if res is not None:
                return res
        meta = build_meta(q_lens, kv_lens, tables, slots, self.geometry, self.dtype, self.device,
                          native=self.native_attention)
        last_rows, t = [], 0
        for w in works:
            t += len(w.tokens)
            if w.index >= 0:
                last_rows.append(t - 1)
        dev = self.device
        return self.model.forward(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta, self.kv,
                                  torch.tensor(last_rows, dtype=torch.long, device=dev), layers)
