"""The integer kernel for 8-bit codes (`csrc/int8_avx2.c`, kernel `int8avx2`): a matrix
w = s c of signed int8 codes with a float scale per group of 32 or 16 inputs, the form GGUF's
Q8_0, Q5_0 and Q6_K take exactly (`blocks.BlockRows.codes`), multiplied on integer dot
products of int16 pairs (AVX2 `vpmaddwd`, AVX-VNNI or AVX-512 VNNI `vpdpwssd`), the
activations quantised per row and group of 32 to ~15 bits as the int4 kernel does. Output
float32; each row computed alone (row-invariant by construction)."""

from __future__ import annotations

import torch

from tokenrouter.runtime.kernels.bindings import check_int4x_rc, int4x_problem
from tokenrouter.runtime.kernels.build import load
from tokenrouter.runtime.kernels.quant import QuantError, QuantTensor

GROUPS = (16, 32)


def int8x_problem(qt: QuantTensor | None = None) -> str | None:
    """Why the int8 kernel cannot take `qt` (or run here at all), or None: it takes 8-bit
    codes with one scale per 16 or 32 inputs, K a multiple of 32, on a CPU with AVX2."""
    if qt is not None:
        if qt.fmt != "q8" or qt.group not in GROUPS or qt.zero is not None:
            return f"it takes 8-bit codes with a scale per 16 or 32 inputs, not {qt.source} (group {qt.group})"
        if qt.shape[1] % 32:
            return f"{qt.shape[1]} input columns are not a multiple of 32"
    return int4x_problem()


def int8x_pack(codes: torch.Tensor, scales: torch.Tensor, group: int, lib=None) -> torch.Tensor:
    """The packed form (uint8) of w = s c: codes int8 [N, K], scales [N, K / group]; the
    scales held as float16 where all of them are float16 values, else float32."""
    lib = lib or load()
    n, k = codes.shape
    s = scales.to(torch.float32).contiguous()
    if codes.dtype != torch.int8 or s.shape != (n, k // group) or k % 32 or group not in GROUPS:
        raise ValueError(f"codes int8 [{n}, {k}] need K % 32 == 0, a group of 16 or 32 and scales [{n}, {k // group}]")
    sbytes = 2 if bool((s.half().float() == s).all()) else 4
    packed = torch.empty(lib.tr_i8x_packed_bytes(n, k, group, sbytes), dtype=torch.uint8)
    check_int4x_rc(lib.tr_i8x_pack(codes.contiguous().data_ptr(), s.data_ptr(), n, k, group, sbytes,
                                   packed.data_ptr()), "int8 packing")
    return packed


def int8x_mm(x: torch.Tensor, packed: torch.Tensor, n: int, xbits: int = 16, out: torch.Tensor | None = None,
             threads: int | None = None, lib=None) -> torch.Tensor:
    """x [T, K] (bf16 or float32, contiguous rows, any row stride) @ W.T -> [T, n] float32 (into
    `out`'s first n columns when given), W as `int8x_pack` packed it; the packing's own
    header is checked against n and K in C."""
    lib = lib or load()
    t, k = x.shape
    if x.dtype not in (torch.bfloat16, torch.float32) or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError(f"x must be a CPU bf16/float32 tensor with contiguous rows, not {x.dtype} {x.stride()}")
    if xbits not in (8, 16) or packed.dtype != torch.uint8 or packed.numel() < 64:
        raise ValueError("xbits must be 8 or 16 and the weights packed by int8x_pack")
    if out is None:
        out = torch.empty(t, n, dtype=torch.float32)
    elif out.dtype != torch.float32 or out.shape[0] != t or out.shape[1] < n or out.stride(1) != 1:
        raise ValueError(f"out must be float32 [{t}, >= {n}] with contiguous rows")
    check_int4x_rc(lib.tr_i8x_mm(x.data_ptr(), int(x.dtype == torch.bfloat16), x.stride(0), t, k, xbits,
                                 packed.data_ptr(), n, out.data_ptr(), out.stride(0), None,
                                 torch.get_num_threads() if threads is None else threads), "int8 product")
    return out


class Int8Avx2Weight:
    """A q8 matrix (group 16 or 32) packed for the int8 kernel; its output is float32."""

    __slots__ = ("packed", "n", "xbits")

    def __init__(self, qt: QuantTensor, xbits: int = 16):
        why = int8x_problem(qt)
        if why:
            raise QuantError(f"the int8 kernel cannot take this [{qt.shape[0]}, {qt.shape[1]}] matrix: {why}")
        self.packed = int8x_pack(qt.codes, qt.scale, qt.group)
        self.n = qt.shape[0]
        self.xbits = xbits

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return int8x_mm(x if x.stride(-1) == 1 else x.contiguous(), self.packed, self.n, self.xbits)
