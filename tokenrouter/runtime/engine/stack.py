"""A quantised model's decode steps as one C call for all its layers (`kernels.decode_stack.DecodeStack`,
`csrc/decode_stack.c`), where the fused path (`Model._fused_layers`) makes nine calls a layer.

It runs where every decoder matrix is on one of the 4-bit C kernels at every row count
(`STACK_KERNELS`: the integer `int4avx2`, or its opt-in `int4avx2-x8`; `int4dp` on AVX-512
bfloat16 dot products, or its AMX twin `int4amx`), whichever the plan chose for each shape,
so a measured plan that mixes them stacks too; the fused path runs; and the step's every
token takes its attention from the C kernel (decodes and short extends with `attention`
native; a step holding a prefill chunk runs the fused path). It makes the very calls the
fused path makes, in its order (each matrix on its kernel with float32 x, which the kernel
rounds itself), so a step gives the same bits either way (tested); what it saves is the
Python between them: on SmolLM2 about 270 calls a step, each with its checks, dispatch and
output allocation.
"""

from __future__ import annotations

import torch

from tokenrouter.runtime.kernels.decode_stack import DecodeStack
from tokenrouter.runtime.kernels.linear import C_INT_KERNELS, PlannedParts

STACK_KERNELS = C_INT_KERNELS  # the kernels it runs: the C ones, which take float32 x and give float32


def stack_problem(model, native_attention: bool) -> str | None:
    """Why `model`'s decode steps cannot run as one stack call, or None."""
    if not model.fused:
        return "the fused C element-wise path does not run this model"
    if not native_attention:
        return "decode attention runs on torch's path"
    kernels = {k for lin in model.decoder_linears() for _, k in lin.plan}
    if not kernels <= set(STACK_KERNELS):
        return f"its matrices run {', '.join(sorted(kernels - set(STACK_KERNELS)))}, not a C int4 kernel"
    switching = sorted({lin.key for lin in model.decoder_linears() if len({k for _, k in lin.plan}) > 1})
    if switching:  # the stack runs one kernel a matrix, the fused path the one for the step's rows
        return f"matrices {', '.join(switching)} change kernel with the row count"
    return None


def build_stack(model, kv) -> DecodeStack:
    """The stack of `model`'s layers over the cache `kv` (a `KVCache`)."""
    c = model.config
    layers = []
    for i, ly in enumerate(model.layers):
        mats = {name: getattr(ly, name) for name in ("qkv", "o", "gate_up", "down")}
        mats = {name: m.parts if isinstance(m, PlannedParts) else m for name, m in mats.items()}
        layers.append({"ln1": _f32(ly.ln1), "ln2": _f32(ly.ln2), "qk_norm": _f32(ly.qk_norm), "qkv_bias": _f32(ly.qkv_bias),
                       "o_bias": _f32(ly.o_bias), "kv": kv.layers[i],
                       # the weight the plan's one kernel runs (`stack_problem`), as the fused path calls it
                       **{name: _weight(lin) for name, lin in mats.items()}})
    return DecodeStack(layers, c.hidden_size, c.intermediate_size, model.nh, model.kvh, model.hd,
                       c.rms_norm_eps, model.scale)


def _weight(lin):
    """The weight a matrix's one kernel runs (a list of them for a fused matrix's parts)."""
    return [_weight(p) for p in lin] if isinstance(lin, list) else lin.impl[lin.plan[0][1]]


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.float32).contiguous()


def segments(layers: int, want: set[int]) -> list[tuple[int, int]]:
    """[(l0, l1), ...] covering 0..layers, cut after each layer whose output is wanted."""
    cuts = sorted({0, layers, *(w for w in want if 0 < w < layers)})
    return list(zip(cuts[:-1], cuts[1:]))
