"""The KV cache tensors: one flat slot array per layer, addressed by `block * block_size + offset`.

Layout [layers, num_blocks * block_size, kv_heads, head_dim] for K and for V: writing a
step's new tokens is one `index_copy_` per layer, and the portable attention path
gathers a request's slots with one index per layer. The block allocator decides which
slots belong to whom; this module only holds memory.
"""

from __future__ import annotations

import torch

from .config import ModelConfig

DEFAULT_BUDGET_BYTES = 1 << 30  # 1 GiB of K+V unless num_blocks is given


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
        shape = (config.num_hidden_layers, num_blocks * block_size,
                 config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' k, v [T, kv_heads, head_dim] at their slots [T]."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)
