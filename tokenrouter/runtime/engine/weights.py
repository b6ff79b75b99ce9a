"""How a model holds its weights in each format: the checkpoint's tensors read and checked, the
decoder's matrices built per format, the LM head's and the embedding's formats.

`quant` (see `kernels/quant.py`): "none" holds float weights (any codes dequantised);
"native" keeps a GGUF file's codes as they come (`QuantTensor`s; float tensors stay float);
"int4"/"int8" quantise the decoder's matrices on load (4-bit codes stay as they are for
int4). A GGUF's embedding and LM head come as `BlockRows` (the file's blocks, read in place).
In the quantised formats the LM head is held as `head_quant` (`quantised_head`): "int4"
(min/max per group of 32), "int8" (per row), "none" (float32), "native" (the file's own
codes on their integer kernel), or "auto" (int4 where the int4 kernel takes the shape, else
int8), unless it comes as int4-runnable codes, which it keeps. int4 is preferred because the
head is the largest matrix a step reads: measured on SmolLM2, it takes the batch-1 step from
14.1 to 11.1 ms with the same greedy agreement (its top candidates are rescored from the
file's codes, `Model.logits`). An explicit "int4" on a shape the kernel cannot take is an
error, as for the decoder's matrices.

q/k/v and gate/up share their input and are fused into one matrix (`fused_matrix`); parts of
different formats (a GGUF's Q4_K q and k with a Q6_K v) stay side by side, each on its own
kernel (`PlannedParts`).
"""

from __future__ import annotations

from typing import Callable

import torch

from tokenrouter.runtime.engine.layers import LinearWeight
from tokenrouter.runtime.kernels.blocks import BlockRows
from tokenrouter.runtime.kernels.linear import PlannedLinear, PlannedParts
from tokenrouter.runtime.kernels.quant import (QUANTS, QuantError, QuantTensor, int4_shape_problem, quantize_int4,
                                               quantize_int8, quantize_q8_0)

HEAD_QUANTS = ("auto", "none", "int4", "int8", "native")
CODED = (QuantTensor, BlockRows)  # what holds a matrix as codes rather than floats


class WeightError(ValueError):
    """A weight is missing or has the wrong shape for the model's config."""


def check_formats(quant: str, head_quant: str, device: torch.device | str) -> None:
    """ValueError for a format that does not exist, QuantError for a quantised model off the CPU."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
    if head_quant not in HEAD_QUANTS:
        raise ValueError(f"head_quant must be one of {', '.join(HEAD_QUANTS)}, not {head_quant!r}")
    if quant != "none" and torch.device(device).type != "cpu":
        raise QuantError(f"quant={quant} runs on CPU only (torch's int4/int8 weight kernels used here are "
                         f"CPU kernels); use quant=none on {device}")


def reader(weights: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, device: torch.device | str):
    """get(name, shape, optional=False, blocks=False): the checkpoint's tensor `name`, checked
    against `shape` (WeightError), None for a missing optional one. A float tensor comes in
    `dtype` on `device`. Codes stay codes where the format holds them so (every one with
    "native", the matrices with "int4"/"int8"): a GGUF's `BlockRows` as they are with `blocks`
    (the embedding and the head, read in place), else decoded into a `QuantTensor` for an
    integer kernel (or dequantised, for a block type no integer kernel takes); elsewhere they
    are dequantised."""
    def get(name: str, shape: tuple[int, ...], optional: bool = False, blocks: bool = False):
        w = weights.get(name)
        if w is None:
            if optional:
                return None
            raise WeightError(f"missing weight {name!r}")
        if tuple(w.shape) != shape:
            raise WeightError(f"weight {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if not isinstance(w, CODED):
            return w.to(device=device, dtype=dtype)
        if not (quant == "native" or (len(shape) == 2 and quant != "none")):
            return w.dequantize(dtype=dtype).to(device)
        if isinstance(w, BlockRows) and not blocks:
            values = w.codes() or w.dequantize(dtype=dtype)
            w.release()  # decoded: the file's pages are not read again
            return values
        return w
    return get


def hold(quant: str):
    """(values, name) -> a decoder matrix's values in format `quant`: float for "none", the
    codes as they come for "native", 4-bit (or per-row 8-bit) codes for "int4" ("int8"),
    quantised from the float values where they come otherwise."""
    def held(w, name: str):
        if quant == "none":
            return dequantized(w)
        if quant == "int4" and not (isinstance(w, QuantTensor) and w.fmt == "q4"):
            return quantize_int4(dequantized(w), name)
        if quant == "int8" and not (isinstance(w, QuantTensor) and w.fmt == "q8" and w.group == w.shape[1]):
            return quantize_int8(dequantized(w), name)
        return w
    return held


def fuse(parts: list):
    """Matrices that share an input as one: `QuantTensor.cat` of codes of one format,
    torch.cat of floats, and for codes of different formats a list of parts (consecutive
    matrices of one format concatenated: q and k apart from a v of another format)."""
    if not all(isinstance(p, QuantTensor) for p in parts):
        return torch.cat([dequantized(p) for p in parts])
    runs: list[list[QuantTensor]] = []
    for p in parts:
        if runs and (p.fmt, p.group) == (runs[-1][0].fmt, runs[-1][0].group):
            runs[-1].append(p)
        else:
            runs.append([p])
    fused = [QuantTensor.cat(r) if len(r) > 1 else r[0] for r in runs]
    return fused[0] if len(fused) == 1 else fused


def map_rows(w, fn):
    """`w` with its rows reordered by `fn`, codes or floats."""
    return w.map_rows(fn) if isinstance(w, CODED) else fn(w)


def dequantized(w):
    """The float values of `w`: codes dequantised, a float tensor as it is."""
    return w.dequantize() if isinstance(w, CODED) else w


# ------------------------------------------------------------------ a decoder matrix per format

def matrix_format(quant: str, dtype: torch.dtype, act_dtype: torch.dtype, device: torch.device | str) -> Callable:
    """(parts, name) -> a decoder matrix held in format `quant`, the parts (matrices sharing
    an input) fused (`fuse`): float32 on CPU on the kernels measured on this host
    (`kernels/plan.py`), other float models on `F.linear`, the quantised formats on their
    planned kernels, parts of different formats side by side (`PlannedParts`)."""
    held = hold(quant)
    planned = quant != "none" or (torch.device(device).type == "cpu" and dtype == torch.float32)

    def matrix(parts: list, name: str):
        w = fuse([held(p, name) for p in parts]) if len(parts) > 1 else held(parts[0], name)
        if isinstance(w, list):
            return PlannedParts([PlannedLinear(p, act_dtype) for p in w])
        if not planned:
            return LinearWeight(w)
        return PlannedLinear(w, dtype if quant == "none" else act_dtype)
    return matrix


# ------------------------------------------------------------------ a quantised model's head and embedding

def quantised_head(src, head_quant: str, name: str = "lm_head.weight"):
    """(the LM head's values in a quantised model's `head_quant`, whether they are `src`'s own):
    `src` is the head or the tied embedding; int4-runnable codes stay as they are."""
    own = src.codes() if isinstance(src, BlockRows) else src
    if isinstance(own, QuantTensor) and own.fmt == "q4" and int4_shape_problem(*own.shape, own.group) is None:
        return own, True  # int4-runnable codes: run them as they are
    if head_quant == "native" and isinstance(own, QuantTensor):
        return own, True
    if head_quant == "int4" or (head_quant == "auto" and int4_shape_problem(*src.shape) is None):
        return quantize_int4_rows(src, name), False
    if head_quant in ("auto", "int8"):
        return quantize_int8(dequantized(src)), False
    return dequantized(src), True  # float32 holds codes' values exactly


def quantize_int4_rows(src, name: str, chunk: int = 8192) -> QuantTensor:
    """`quantize_int4` of `src`'s float values, a chunk of rows at a time, so a 150k-row head
    never exists as float32 all at once."""
    n = src.shape[0]
    if not isinstance(src, BlockRows) or n <= chunk:
        return quantize_int4(dequantized(src), name)
    parts = [quantize_int4(src.dequantize(torch.arange(r, min(n, r + chunk))), name) for r in range(0, n, chunk)]
    src.release()  # only the rescored rows are read again
    return QuantTensor.cat(parts)


def embedding_codes(embed, head, head_w) -> QuantTensor | BlockRows | None:
    """A quantised model's embedding as codes (rows dequantised on lookup), or None to keep its
    float rows: a file's own codes or blocks; tied (`head` None) and from float with the head
    held as codes, Q8_0-style codes (a quarter of the bytes, which also rescore the coarser
    head's top candidates), or the head's own codes where the width is no multiple of 32."""
    if isinstance(embed, CODED):
        return embed
    if head is None and isinstance(head_w, QuantTensor):
        return quantize_q8_0(embed) if embed.shape[1] % 32 == 0 else head_w
    return None
