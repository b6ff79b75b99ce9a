"""How a model holds its weights in each format: the checkpoint's tensors read and checked, the
decoder's matrices built per format, the LM head's and the embedding's formats.

`quant` (see `kernels/quant.py`): "none" holds float weights (any `QuantTensor` dequantised);
"native" keeps `QuantTensor`s as they come (float tensors stay float); "int4"/"int8"
quantise the decoder's matrices on load. In the quantised formats the LM head is held as
`head_quant` (`quantised_head`): "int4" (min/max per group of 32), "int8" (per row), "none"
(float32), or "auto" (int4 where the int4 kernel takes the shape, else int8), unless it
comes as int4-runnable codes, which it keeps. int4 is preferred because the head is the
largest matrix a step reads: measured on SmolLM2, it takes the batch-1 step from 14.1 to
11.1 ms with the same greedy agreement (its top candidates are rescored from the file's
codes, `Model.logits`). An explicit "int4" on a shape the kernel cannot take is an error,
as for the decoder's matrices.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from tokenrouter.runtime.engine.layers import LinearWeight
from tokenrouter.runtime.kernels.linear import PlannedLinear
from tokenrouter.runtime.kernels.quant import (QUANTS, QuantError, QuantTensor, int4_shape_problem, quantize_int4,
                                               quantize_int8, quantize_q8_0)

HEAD_QUANTS = ("auto", "none", "int4", "int8")


class WeightError(ValueError):
    """A weight is missing or has the wrong shape for the model's config."""


def check_formats(quant: str, head_quant: str, device: torch.device | str) -> None:
    """ValueError for a format that does not exist, QuantError for a quantised model off the CPU."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    if head_quant not in HEAD_QUANTS:
        raise ValueError(f"head_quant must be auto, none, int4 or int8, not {head_quant!r}")
    if quant != "none" and torch.device(device).type != "cpu":
        raise QuantError(f"quant={quant} runs on CPU only (torch's int4/int8 weight kernels used here are "
                         f"CPU kernels); use quant=none on {device}")


def reader(weights: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, device: torch.device | str):
    """get(name, shape, optional=False): the checkpoint's tensor `name`, checked against `shape`
    (WeightError), None for a missing optional one. A float tensor comes in `dtype` on `device`;
    a `QuantTensor` stays codes where the format holds it so (every one with "native", the
    matrices with "int4"/"int8"), else it is dequantised."""
    def get(name: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
        w = weights.get(name)
        if w is None:
            if optional:
                return None
            raise WeightError(f"missing weight {name!r}")
        if tuple(w.shape) != shape:
            raise WeightError(f"weight {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if isinstance(w, QuantTensor):
            return w if quant == "native" or (len(shape) == 2 and quant != "none") else \
                w.dequantize(dtype=dtype).to(device)
        return w.to(device=device, dtype=dtype)
    return get


def fuse(parts: list):
    """torch.cat of float matrices, `QuantTensor.cat` of quantised ones; a fused matrix of mixed
    formats is held as float."""
    if all(isinstance(p, QuantTensor) for p in parts):
        try:
            return QuantTensor.cat(parts)
        except QuantError:
            pass
    return torch.cat([dequantized(p) for p in parts])


def map_rows(w, fn):
    """`w` with its rows reordered by `fn`, codes or floats."""
    return w.map_rows(fn) if isinstance(w, QuantTensor) else fn(w)


def dequantized(w):
    """The float values of `w`: a `QuantTensor` dequantised, a float tensor as it is."""
    return w.dequantize() if isinstance(w, QuantTensor) else w


# ------------------------------------------------------------------ a decoder matrix per format

def float_matrix(w: torch.Tensor, name: str, *, dtype: torch.dtype, planned: bool):
    """quant="none": on the kernels measured on this host (`planned`: CPU float32), else `F.linear`."""
    return PlannedLinear(w, dtype) if planned else LinearWeight(w)


def native_matrix(w, name: str, *, act_dtype: torch.dtype) -> PlannedLinear:
    """quant="native": a GGUF file's own codes as they come (a float tensor stays float)."""
    return PlannedLinear(w, act_dtype)


def int4_matrix(w, name: str, *, act_dtype: torch.dtype) -> PlannedLinear:
    """quant="int4": 4-bit codes as they come, anything else quantised on load."""
    if not (isinstance(w, QuantTensor) and w.fmt == "q4"):
        w = quantize_int4(dequantized(w), name)
    return PlannedLinear(w, act_dtype)


def int8_matrix(w, name: str, *, act_dtype: torch.dtype) -> PlannedLinear:
    """quant="int8": per-row 8-bit codes as they come, anything else quantised on load."""
    if not (isinstance(w, QuantTensor) and w.fmt == "q8" and w.group == w.shape[1]):
        w = quantize_int8(dequantized(w), name)
    return PlannedLinear(w, act_dtype)


def matrix_format(quant: str, dtype: torch.dtype, act_dtype: torch.dtype, device: torch.device | str) -> Callable:
    """(values, name) -> a decoder matrix held in format `quant`."""
    if quant == "none":
        # float32 on CPU: each matrix on the kernels measured fastest here per row count (kernels/plan.py)
        return partial(float_matrix, dtype=dtype, planned=torch.device(device).type == "cpu" and dtype == torch.float32)
    return partial({"native": native_matrix, "int4": int4_matrix, "int8": int8_matrix}[quant], act_dtype=act_dtype)


# ------------------------------------------------------------------ a quantised model's head and embedding

def quantised_head(src, head_quant: str):
    """The LM head's values (`src`, the head or the tied embedding) in a quantised model's
    `head_quant`: int4-runnable codes as they are, else as `head_quant` says."""
    if isinstance(src, QuantTensor) and src.fmt == "q4" and int4_shape_problem(*src.shape, src.group) is None:
        return src  # int4-runnable codes: run them as they are
    if head_quant == "int4" or (head_quant == "auto" and int4_shape_problem(*src.shape) is None):
        return quantize_int4(dequantized(src), "lm_head.weight")
    if head_quant in ("auto", "int8"):
        return quantize_int8(dequantized(src))
    return dequantized(src)


def embedding_codes(embed, head, head_w) -> QuantTensor | None:
    """A quantised model's embedding as codes (rows dequantised on lookup), or None to keep its
    float rows: a file's own codes; tied (`head` None) and from float with the head held as
    codes, Q8_0-style codes (a quarter of the bytes, which also rescore the coarser head's
    top candidates), or the head's own codes where the width is no multiple of 32."""
    if isinstance(embed, QuantTensor):
        return embed
    if head is None and isinstance(head_w, QuantTensor):
        return quantize_q8_0(embed) if embed.shape[1] % 32 == 0 else head_w
    return None
