"""How an engine holds and runs its model: `EngineOptions`, everything `Engine` takes besides the
model's config and weights, with the defaults every caller gets unless it says otherwise.

    Engine(config, weights, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=8))
    Engine(m.config, m.weights, m.engine_options(max_model_len=256))   # a loaded model's format
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EngineOptions:
    # where and in what the model runs
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    # the paged KV cache: tokens per block; blocks (None: a 1 GiB budget, at least one
    # `max_model_len` sequence); the longest sequence (None: the model's max_position_embeddings)
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    prefix_reuse: bool = False  # a new sequence shares the full blocks another computed for its prefix
    max_batched_tokens: int = 2048  # tokens per forward; longer steps run as several
    # CUDA graphs for decode steps on CUDA; "eager" runs their padded static shapes on any device
    cuda_graphs: bool | str = True
    # the weight format ("none" | "native" | "int4" | "int8", see kernels/quant.py), the
    # quantised products' activation dtype, and the LM head's format ("auto" | "none" | "int4" | "int8")
    quant: str = "none"
    act_dtype: torch.dtype = torch.bfloat16
    head_quant: str = "auto"
    # the matrices' kernels: a kernel name or {shape key: plan} forces them, None measures them
    # on this host (cached at `plan_cache` when given; kernels/plan.py)
    kernel_plan: dict | str | None = None
    plan_cache: str | None = None
    # decode attention: "auto" | "native" (the C kernel) | "torch"; None: $TOKENROUTER_ATTENTION, else "auto"
    attention: str | None = None
    # a quantised model's element-wise work in C: None where it can run, True demands it, False never
    fused_ops: bool | None = None
    # the KV cache's elements: "float32", "float16", "bfloat16", or None: a quantised model's on
    # CPU with half-precision activations half precision (kv_cache.half_kv_dtype: float16 where
    # the CPU converts it in hardware, else bfloat16) where the C kernels build, any other its own dtype
    kv_dtype: str | None = None
    # a quantised model's decode steps as one C call for all layers (engine/stack.py): None where
    # it can run, True demands it, False never
    decode_stack: bool | None = None
