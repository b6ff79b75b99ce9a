"""Weight formats: a matrix held as integer codes with per-group scales, and the kernels that run it.

`quant` (a model block attribute, `--quant` on the commands) says how a model's weights are held:

- `none`: float, as the checkpoint gives them (a GGUF file dequantised), the exact default;
- `native`: a GGUF file's own blocks as they are (`blocks.py`): Q4_0, Q4_1 and Q4_K as
  4-bit codes (q4, group 32) on an int4 kernel; Q5_0, Q8_0 and Q6_K as int8 codes with a
  scale per 32 or 16 weights (q8, the file's values exactly) on the 8-bit kernel
  (`int8x.py`); F32/F16/BF16 tensors stay float, and so do Q5_1 / Q5_K matrices
  (dequantised exactly: no kernel here takes codes with a min per block of 5 bits);
- `int4`: a float checkpoint quantised on load, asymmetric min/max per group of 32 along the
  input dimension (Q4_1's recipe: scale = (max - min) / 15, zero = min);
- `int8`: symmetric per output row (scale = max |w| / 127), torch's `_weight_int8pack_mm`.

The int4 kernel computes w = (q - 8) * scale + zero per group, so a GGUF block maps onto it
exactly: Q4_0 (w = d (q - 8)) is scale = d, zero = 0; Q4_1 (w = d q + m) is scale = d,
zero = m + 8 d; Q4_K (w = d sc q - dmin m per sub-block of 32) is scale = d sc,
zero = 8 d sc - dmin m. Only bfloat16 activations take its vectorised path (float32 falls to a
scalar loop), so a quantised layer casts its input to `act_dtype` (bfloat16 by default)
and its output back; the residual stream, norms, attention and KV cache stay in the
engine's dtype. With float32 activations the product equals the dequantised matmul to
rounding (the exactness test). The kernel takes N % 16 == 0 and K % 32 == 0.

Which kernel runs a matrix is chosen per shape by measurement on the host (`plan.py`),
one kernel for every row count: the int4 kernel holds its scales and zeros in `act_dtype`
and rounds its input and output to it, so it does not compute the float kernels' numbers,
and a plan that switched kernels with the batch size would change a request's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.runtime.kernels.bindings import int4dp_mm, int4x_mm, int4x_pack, int4x_problem
from tokenrouter.runtime.kernels.bindings import int4dp_problem as host_int4dp_problem

QUANTS = ("none", "native", "int4", "int8")
GROUP = 32  # GGUF's block length, and the int4 group used on load


class QuantError(ValueError):
    """A weight cannot be held in the requested format (the message names it and its shape)."""


@dataclass
class QuantTensor:
    """A matrix [N, K] as codes with per-group scales (group = K for per-row int8).

    fmt "q4": codes uint8 in 0..15, w = (q - 8) * scale + zero (zero None means 0);
    fmt "q8": codes int8, w = q * scale (group 32 or 16: GGUF's Q8_0, Q5_0, Q6_K; or per row).
    `source` names the origin (a GGUF type such as "Q4_1", or "int4"/"int8" for on-load)."""

    fmt: str
    codes: torch.Tensor
    scale: torch.Tensor  # float32 [N, K // group]
    zero: torch.Tensor | None
    group: int
    source: str

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def numel(self) -> int:
        return self.codes.numel()

    def nbytes(self) -> int:
        """Bytes of the format itself (4-bit codes count half a byte)."""
        code_bytes = self.codes.numel() // 2 if self.fmt == "q4" else self.codes.numel()
        extra = self.scale.numel() * 2 * (1 if self.zero is None else 2)  # fp16 scales, as GGUF
        return code_bytes + extra

    def dequantize(self, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weights these codes stand for (only `rows` of them, if given)."""
        codes, scale, zero = self.codes, self.scale, self.zero
        if rows is not None:
            codes, scale = codes[rows], scale[rows]
            zero = None if zero is None else zero[rows]
        n, k = codes.shape
        q = codes.to(torch.float32)
        if self.fmt == "q4":
            q = q - 8.0
        w = q.view(n, k // self.group, self.group) * scale.unsqueeze(-1)
        if zero is not None:
            w = w + zero.unsqueeze(-1)
        return w.view(n, k).to(dtype)

    def map_rows(self, fn) -> "QuantTensor":
        """The same matrix with its rows reordered by `fn` (applied to codes, scales and zeros alike)."""
        return QuantTensor(self.fmt, fn(self.codes), fn(self.scale), None if self.zero is None else fn(self.zero),
                           self.group, self.source)

    @staticmethod
    def cat(parts: list["QuantTensor"]) -> "QuantTensor":
        """Stack matrices of one format along the rows (fused q/k/v, gate/up)."""
        p0 = parts[0]
        if any(p.fmt != p0.fmt or p.group != p0.group for p in parts):
            raise QuantError("fused matrices must share one format: " + ", ".join(p.source for p in parts))
        zeros = [p.zero for p in parts]
        if any(z is None for z in zeros) and not all(z is None for z in zeros):
            zeros = [torch.zeros_like(p.scale) if p.zero is None else p.zero for p in parts]
        return QuantTensor(p0.fmt, torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                           None if zeros[0] is None else torch.cat(zeros), p0.group,
                           "+".join(dict.fromkeys(p.source for p in parts)))


def int4_shape_problem(n: int, k: int, group: int = GROUP) -> str | None:
    """Why the int4 kernel cannot take an [n, k] matrix, or None if it can."""
    if n % 16:
        return f"{n} output rows are not a multiple of 16"
    if k % group:
        return f"{k} input columns are not a multiple of the group size {group}"
    return None


def quantize_int4(w: torch.Tensor, name: str = "weight", group: int = GROUP) -> QuantTensor:
    """Asymmetric min/max quantisation per group of `group` inputs (Q4_1's recipe)."""
    n, k = w.shape
    why = int4_shape_problem(n, k, group)
    if why:
        raise QuantError(f"quant=int4 cannot hold {name} of shape [{n}, {k}]: {why}; use quant=int8 or none")
    g = w.detach().to(torch.float32).reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo) / 15.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((g - lo.unsqueeze(-1)) / safe.unsqueeze(-1)).clamp_(0, 15).to(torch.uint8).view(n, k)
    # the kernel's w = (q - 8) * scale + zero with zero = min + 8 * scale
    return QuantTensor("q4", q, scale, lo + 8.0 * scale, group, "int4")


def quantize_q8_0(w: torch.Tensor) -> QuantTensor:
    """Symmetric int8 per group of 32 (GGUF Q8_0's recipe): no kernel runs it, but embedding
    lookups and the head's exact rescoring read it at a quarter of float32's bytes."""
    n, k = w.shape
    g = w.detach().to(torch.float32).reshape(n, k // GROUP, GROUP)
    scale = g.abs().amax(-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(g / safe.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8).view(n, k)
    return QuantTensor("q8", q, scale, None, GROUP, "q8_0")


def quantize_int8(w: torch.Tensor, name: str = "weight") -> QuantTensor:
    """Symmetric per-output-row quantisation (what `_weight_int8pack_mm` takes)."""
    n, k = w.shape
    w = w.detach().to(torch.float32)
    scale = w.abs().amax(1, keepdim=True) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe).clamp_(-127, 127).to(torch.int8)
    return QuantTensor("q8", q, scale, None, k, "int8")


class Int4Weight:
    """A q4 matrix packed for torch's CPU int4 kernel, scales and zeros in the activation dtype."""

    __slots__ = ("packed", "sz", "group", "act_dtype")

    def __init__(self, qt: QuantTensor, act_dtype: torch.dtype):
        n, k = qt.shape
        why = int4_shape_problem(n, k, qt.group)
        if why:
            raise QuantError(f"the int4 kernel cannot take a [{n}, {k}] matrix: {why}")
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qt.codes.to(torch.int32).contiguous(), 1)
        zero = torch.zeros_like(qt.scale) if qt.zero is None else qt.zero
        self.sz = torch.stack([qt.scale.T, zero.T], -1).to(act_dtype).contiguous()  # [K/group, N, 2]
        self.group = qt.group
        self.act_dtype = act_dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T in x's dtype (the product runs in the activation dtype). No casts where x
        already is in it: the fused decode path calls this 120 times a step."""
        if x.dtype is self.act_dtype and x.is_contiguous():
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.sz)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.act_dtype).contiguous(), self.packed,
                                                       self.group, self.sz)
        return y.to(x.dtype)


class Int4DotWeight:
    """A q4 matrix packed for the C kernel on AVX-512 bfloat16 dot products
    (`csrc/int4_matmul.c`, which documents the layout): the codes, and per output row and
    group of 32 the scale and the min (w = q scale + min, min = zero - 8 scale) as float16.
    Its output is float32 whatever x's dtype (x is rounded to bfloat16 inside)."""

    __slots__ = ("codes", "sm", "n", "amx")

    SHIFTS = (0, 16, 4, 20, 8, 24, 12, 28)  # input i of 8 goes to bit 4 (i // 2) + 16 (i % 2)

    def __init__(self, qt: QuantTensor, amx: bool = False):
        why = int4dp_problem(qt, amx)
        if why:
            raise QuantError(f"the C int4 kernel cannot take this [{qt.shape[0]}, {qt.shape[1]}] matrix: {why}")
        n, k = qt.shape
        c = qt.codes.to(torch.int64).view(n // 16, 16, k // 32, 4, 8)
        shifts = torch.tensor(self.SHIFTS, dtype=torch.int64)
        d = (c << shifts).sum(-1)  # [n/16, 16, k/32, 4] < 2**32
        d = torch.where(d >= 2 ** 31, d - 2 ** 32, d).to(torch.int32)  # the same bits as int32
        self.codes = d.permute(0, 2, 3, 1).contiguous()  # [n/16, k/32, 4, 16]
        zero = torch.zeros_like(qt.scale) if qt.zero is None else qt.zero
        mins = zero - 8.0 * qt.scale
        sm = torch.stack([qt.scale, mins]).view(2, n // 16, 16, k // 32)  # [2, n/16, 16, k/32]
        self.sm = sm.permute(1, 3, 0, 2).to(torch.float16).contiguous()  # [n/16, k/32, 2, 16]
        self.n = n
        self.amx = amx  # the AMX-tile variant (`int4amx`): the same layout, other summation order

    def variant(self, amx: bool) -> "Int4DotWeight":
        """The other summation (AMX tiles or dot products) on these same packed codes."""
        why = host_int4dp_problem(amx)
        if why:
            raise QuantError(f"the C int4 kernel cannot run here: {why}")
        w = object.__new__(Int4DotWeight)
        w.codes, w.sm, w.n, w.amx = self.codes, self.sm, self.n, amx
        return w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # packed above, so the packing's checks are skipped on this hot path (`checked`)
        return int4dp_mm(x if x.stride(-1) == 1 else x.contiguous(), self.codes, self.sm, self.n, self.amx, True)


def int4dp_problem(qt: QuantTensor, amx: bool = False) -> str | None:
    """Why `Int4DotWeight` cannot hold `qt`, or None: a q4 matrix of group 32 whose shape the
    kernel takes (`float16_problem`), on a CPU where the kernel is built."""
    why = float16_problem(qt) or int4_shape_problem(*qt.shape)
    return why or host_int4dp_problem(amx)


def float16_problem(qt: QuantTensor) -> str | None:
    """Why the C int4 kernels, which hold a group's scale s and min m (w = s q + m) as float16,
    cannot take `qt`, or None: it must be 4-bit codes in groups of 32 whose s and m float16
    holds closely enough: no weight may move by more than 2**-11 of its row's largest
    (GGUF's Q4_0/Q4_1 store them as float16, so those move by nothing)."""
    if qt.fmt != "q4" or qt.group != GROUP:
        return f"it takes 4-bit codes in groups of {GROUP}, not {qt.source} (group {qt.group})"
    s, m = scale_and_min(qt)
    moved = 15 * (s - s.half().float()).abs() + (m - m.half().float()).abs()  # NaN/inf on overflow
    largest = (15 * s.abs() + m.abs()).amax(1, keepdim=True)
    if not bool((moved <= largest * 2.0 ** -11).all()):
        return "its scales or mins do not fit float16 (the kernel holds them so)"
    return None


def scale_and_min(qt: QuantTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, m) float32 [N, K / group] of w = s q + m (from w = (q - 8) scale + zero)."""
    s = qt.scale.to(torch.float32)
    zero = torch.zeros_like(s) if qt.zero is None else qt.zero.to(torch.float32)
    return s, zero - 8.0 * s


class Int4Avx2Weight:
    """A q4 matrix packed for the integer int4 kernel (`csrc/int4_avx2.c`, which documents the
    layout: tiles of 16 outputs, per group of 32 inputs 256 bytes of codes and 16 float16
    scales and mins; 5 bits a weight). x is quantised per row and group of 32 to `xbits`
    (16: two int8 digits, ~15 bits; 8: int8) and multiplied on integer dot products (AVX2,
    AVX-VNNI or AVX-512 VNNI, whichever this host's build holds); the output is float32."""

    __slots__ = ("packed", "n", "xbits")

    def __init__(self, qt: QuantTensor, xbits: int = 16, packed: torch.Tensor | None = None):
        why = int4avx2_problem(qt)
        if why:
            raise QuantError(f"the integer int4 kernel cannot take this [{qt.shape[0]}, {qt.shape[1]}] matrix: {why}")
        self.packed = int4x_pack(qt.codes, *scale_and_min(qt)) if packed is None else packed
        self.n = qt.shape[0]
        self.xbits = xbits

    def variant(self, xbits: int) -> "Int4Avx2Weight":
        """The same packed codes with activations quantised to `xbits`."""
        w = object.__new__(Int4Avx2Weight)
        w.packed, w.n, w.xbits = self.packed, self.n, xbits
        return w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # packed above, so the packing's checks are skipped on this hot path (`checked`)
        return int4x_mm(x if x.stride(-1) == 1 else x.contiguous(), self.packed, self.n, self.xbits, checked=True)


def int4avx2_problem(qt: QuantTensor) -> str | None:
    """Why `Int4Avx2Weight` cannot hold `qt`, or None: `float16_problem`'s rule (any number of
    output rows), on a CPU where the kernel is built."""
    return float16_problem(qt) or int4x_problem()


class Int8Weight:
    """A per-row q8 matrix for torch's `_weight_int8pack_mm`."""

    __slots__ = ("codes", "scale", "act_dtype")

    def __init__(self, qt: QuantTensor, act_dtype: torch.dtype):
        if qt.fmt != "q8" or qt.group != qt.shape[1]:
            raise QuantError(f"the int8 kernel takes one scale per output row, not {qt.source} "
                             f"(group {qt.group})")
        self.codes = qt.codes.contiguous()
        self.scale = qt.scale.view(-1).to(act_dtype).contiguous()
        self.act_dtype = act_dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x.to(self.act_dtype).contiguous(), self.codes, self.scale).to(x.dtype)
