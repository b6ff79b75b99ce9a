"""The KV cache tensors: per layer, K's heads then V's, each a run of fixed-size blocks.

Layout [layers, 2 * kv_heads, num_blocks, block_size, head_dim]; a token's slot is
`block * block_size + offset`. Its elements are the model's dtype, or a half-precision
type (`half_kv_dtype`, `Engine`'s `kv_dtype`): written rounded to nearest even, read back
widened to float32 (the C attention kernel widens as it reads; torch's path converts what it
gathers). Writing a step's new tokens is one `index_copy_` per
layer. The portable attention path gathers whole blocks with one `index_select` per
layer (each index a block_size x head_dim row of the flat cache), and the result is
already [heads, batch, blocks * block_size, head_dim] contiguous, the layout a batched
matrix multiply wants, with no copy in between. Against the slot-major layout this
replaced (one 768-byte index per token, then torch's fused attention kernel) it measured
1.07x at batch 16 and 1.3x at batch 16 with 256 tokens of context (`benchmarks/README.md`,
"Engine"). The block allocator decides which blocks belong to whom; this module only
holds memory.
"""

from __future__ import annotations

import torch

from tokenrouter.runtime.engine.config import ModelConfig

DEFAULT_BUDGET_BYTES = 1 << 30  # 1 GiB of K+V unless num_blocks is given
KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def half_kv_dtype(flags: str) -> torch.dtype:
    """The half-precision cache type for a CPU with these flags: float16 where F16C converts it
    in one instruction each way (11 significant bits: 8x finer than bfloat16's 8; its range,
    to 65504, holds K and V of the models served here), else bfloat16, whose conversion is a
    shift on any CPU and whose range is float32's."""
    return torch.float16 if "f16c" in flags.split() else torch.bfloat16


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem


def default_num_blocks(config: ModelConfig, block_size: int, dtype: torch.dtype, max_model_len: int,
                       budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int:
    """As many blocks as the budget holds, but always room for one sequence of max_model_len."""
    one_seq = -(-max_model_len // block_size)
    return max(one_seq, budget_bytes // bytes_per_block(config, block_size, dtype))


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device | str, dtype: torch.dtype):
        self.kv_heads = config.num_key_value_heads
        layers, heads, hd = config.num_hidden_layers, 2 * self.kv_heads, config.head_dim
        self.kv = torch.zeros((layers, heads, num_blocks, block_size, hd), device=device, dtype=dtype)
        self._by_slot = self.kv.view(layers, heads, num_blocks * block_size, hd)
        self._by_row = self.kv.view(layers, heads * num_blocks, block_size * hd)
        self._gathered: torch.Tensor | None = None  # reused gather buffer (CPU)
        self.layers = list(self.kv.unbind(0))  # each layer's view, made once (C kernels take them)

    @property
    def k(self) -> torch.Tensor:
        """K as a [layers, slots, kv_heads, head_dim] view (for inspection and tests)."""
        return self._by_slot[:, :self.kv_heads].transpose(1, 2)

    @property
    def v(self) -> torch.Tensor:
        return self._by_slot[:, self.kv_heads:].transpose(1, 2)

    def gather(self, layer: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows of the layer's cache viewed as [heads * blocks, block_size * head_dim]
        (one block of one head each), stacked in `rows` order. Valid until the next call.

        On CPU the result lives in a buffer reused from step to step: a fresh tensor
        above glibc's 32 MB mmap limit is page-faulted in anew on every step (measured: a
        68 MB gather took 53 ms into a new tensor, 9.6 ms into a reused one, 1 thread)."""
        src = self._by_row[layer]
        if src.device.type != "cpu":
            return src.index_select(0, rows)
        n = rows.numel()
        if self._gathered is None or self._gathered.shape[0] < n:
            self._gathered = None  # free the old buffer before allocating the new one
            self._gathered = src.new_empty(n + n // 4, src.shape[1])
        return torch.index_select(src, 0, rows, out=self._gathered[:n])

    def copy_block(self, src: int, dst: int) -> None:
        """Block dst takes block src's K and V, in every layer and head (a fork's copy)."""
        self.kv[:, :, dst].copy_(self.kv[:, :, src])

    def write(self, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Store the new tokens' K and V, kv [T, 2 * kv_heads, head_dim], at their slots [T]."""
        self._by_slot[layer].index_copy_(1, slots, kv.transpose(0, 1).to(self.kv.dtype))
