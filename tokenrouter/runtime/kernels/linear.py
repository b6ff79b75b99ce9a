"""A matrix of a CPU model and the kernels that can run it: `PlannedLinear` holds a matrix's
source values (float or `quant.QuantTensor`), builds the kernels that compute its exact
values, and runs each product on the kernel its plan (`plan.choose`) gives the row count.

Kernels:
- `int4`: torch's int4 kernel on packed codes (q4 formats);
- `int4dp`: the C kernel on AVX-512 bfloat16 dot products (`csrc/int4_matmul.c`; q4 formats
  on CPUs that have them), which unpacks each block of codes once for up to 8 rows and keeps
  the scales, mins and output in float16/float32 where torch's kernel rounds them to bfloat16;
- `int4amx`: the same on AMX tiles (one `tdpbf16ps` per block and group for up to 16 rows),
  where the CPU has them; its sums run in another order, so it is a kernel of its own;
- `int4avx2`: the C kernel on integer dot products (`csrc/int4_avx2.c`; q4 formats on CPUs
  with AVX2, on AVX-VNNI or AVX-512 VNNI where the build has them): x quantised per row and
  group of 32 to ~15 bits (two int8 digits), the products exact integers, scales, mins and
  output float32; its rows computed alone, so it is row-invariant by construction;
- `int4avx2-x8`: the same with x quantised to int8 (llama.cpp's numerics: 1.5-1.8x faster
  at 8-16 rows, but under the 99% greedy-agreement bar on SmolLM2 as the decoder's kernel):
  measured and chosen only for an LM head whose top candidates are rescored exactly
  (`rescored`: greedy tokens then agree as with 16 bits, 808/808 on SmolLM2); elsewhere
  only a plan that names it (`kernel_plan="int4avx2-x8"`) runs it (`OPT_IN`);
- `int8avx2`: the C kernel for 8-bit codes on integer dot products (`csrc/int8_avx2.c`, `int8x.py`;
  q8 formats with a scale per 16 or 32 inputs: GGUF's Q8_0, Q5_0 and Q6_K exactly): x quantised
  as for `int4avx2`, the products exact integers, output float32, row-invariant by construction;
- `int8`: `_weight_int8pack_mm` (per-row q8);
- `onednn`: float32 weights reordered once for oneDNN (`onednn_linear`, rows padded to
  `onednn_rows`);
- `mkl`: float32 `W @ x.T` (one row padded to two real rows: MKL's one-row path is slower);
- `linear`: float32 `F.linear(x, W)`, what `transformers` runs.
After the choice (`finalize`), only what the chosen kernels need is kept: a matrix that int4
runs holds no float copy at all, and `mkl` and `linear` share one plain weight.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from tokenrouter.runtime.kernels.bindings import int4dp_problem as host_int4dp_problem
from tokenrouter.runtime.kernels.int8x import Int8Avx2Weight, int8x_problem
from tokenrouter.runtime.kernels.quant import (Int4Avx2Weight, Int4DotWeight, Int4Weight, Int8Weight, QuantTensor,
                                               int4_shape_problem, int4avx2_problem, int4dp_problem)

INT_KERNELS = ("int4", "int4dp", "int4amx", "int4avx2", "int4avx2-x8", "int8avx2", "int8")  # no float copy
OPT_IN = ("int4avx2-x8",)  # timed only for a rescored head (`measurable`); elsewhere only when named
# the C kernels: float32 output whatever x's dtype, which they round themselves (int4dp, int4amx
# to bfloat16; int4avx2 to its own ~15 bits, so a float32 x gives it more than a bfloat16 one)
C_INT_KERNELS = ("int4dp", "int4amx", "int4avx2", "int4avx2-x8", "int8avx2")
PLAIN_KERNELS = ("linear", "mkl")  # float kernels on the plain [out, in] weight (one copy for both)


# Row counts oneDNN runs, rounded up to: multiples of 4 to 64, of 16 to 512, then of 64.
# oneDNN keeps memory for every row count it has seen (measured: 0.5 MB each for one
# [1536, 576] weight, 558 MB after 1,200 row counts), and a serving process sees every row
# count its batches make; padded, it sees at most 16 + 28 + 24 per weight shape (37 MB over
# the same 1,200), at a cost of at most 3 rows, 15 rows, 63 rows.
_ROW_STEPS = ((4, 64), (16, 512), (64, None))


def onednn_rows(t: int) -> int:
    """The row count a t-row product runs as on oneDNN (`_ROW_STEPS`)."""
    for step, upto in _ROW_STEPS:
        if upto is None or t <= upto:
            return -(-t // step) * step
    raise AssertionError("unreachable")


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ b) on a oneDNN-packed weight, the rows padded to `onednn_rows`."""
    t = x.shape[0]
    m = onednn_rows(t)
    if m != t:
        x = torch.cat([x, x.new_zeros(m - t, x.shape[1])])
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, b, "none", [], "")[:t]


def _mkl(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 1:
        return (w @ x.repeat(2, 1).T)[:, 0].contiguous().unsqueeze(0)
    return (w @ x.contiguous().T).T.contiguous()


class PlannedLinear:
    """One matrix of a CPU model (float32 or quantised): its source values, the kernels built
    for it, and the plan [(up to rows, kernel), ...] that picks one per call."""

    __slots__ = ("source", "act_dtype", "impl", "plan", "_float", "shape", "key", "rescored")

    def __init__(self, source: QuantTensor | torch.Tensor, act_dtype: torch.dtype, rescored: bool = False):
        """`rescored`: an LM head whose top candidates are recomputed exactly afterwards, so a
        coarser kernel (`OPT_IN`) is measured for it too."""
        self.source = source
        self.act_dtype = act_dtype
        self.rescored = rescored
        self.impl: dict[str, object] = {}
        self.plan: list[tuple[int, str]] = []
        self._float = None
        self.shape = tuple(source.shape)
        fmt = f"{source.fmt}g{source.group}" if isinstance(source, QuantTensor) else "f32"
        # what the plan is chosen by
        self.key = f"{self.shape[0]}x{self.shape[1]}:{fmt}" + (":rescored" if rescored else "")

    def candidates(self) -> list[str]:
        """The kernels that can run this matrix here (`measurable` filters what is timed)."""
        s = self.source
        out = []
        if isinstance(s, QuantTensor) and s.fmt == "q4" and int4_shape_problem(*s.shape, s.group) is None:
            out.append("int4")
            if self.act_dtype == torch.bfloat16 and int4dp_problem(s) is None:  # these round x to bf16
                out += ["int4dp"] + (["int4amx"] if host_int4dp_problem(amx=True) is None else [])
        # rounds x to ~15 bits: not float32's exactness either (act_dtype float32 asks for that)
        if isinstance(s, QuantTensor) and self.act_dtype == torch.bfloat16 and int4avx2_problem(s) is None:
            out += ["int4avx2", "int4avx2-x8"]
        if isinstance(s, QuantTensor) and self.act_dtype == torch.bfloat16 and int8x_problem(s) is None:
            out.append("int8avx2")
        if isinstance(s, QuantTensor) and s.fmt == "q8" and s.group == s.shape[1]:
            out.append("int8")
        if torch.backends.mkldnn.is_available():
            out.append("onednn")
        out += PLAIN_KERNELS
        return out

    def measurable(self) -> list[str]:
        """The candidates a measured plan times: all but the `OPT_IN` ones, which only a
        rescored head's plan measures."""
        return [k for k in self.candidates() if self.rescored or k not in OPT_IN]

    def float_weight(self) -> torch.Tensor:
        if self._float is None:
            s = self.source
            self._float = s.dequantize() if isinstance(s, QuantTensor) else s.to(torch.float32).contiguous()
        return self._float

    def build(self, kernels: Iterable[str]) -> None:
        for k in kernels:
            if k in self.impl:
                continue
            if k == "int4":
                self.impl[k] = Int4Weight(self.source, self.act_dtype)
            elif k in ("int4dp", "int4amx"):
                twin = self.impl.get("int4amx" if k == "int4dp" else "int4dp")  # the same packing
                amx = k == "int4amx"
                self.impl[k] = twin.variant(amx) if twin is not None else Int4DotWeight(self.source, amx)
            elif k in ("int4avx2", "int4avx2-x8"):
                twin = self.impl.get("int4avx2-x8" if k == "int4avx2" else "int4avx2")  # the same packing
                xbits = 8 if k == "int4avx2-x8" else 16
                self.impl[k] = twin.variant(xbits) if twin is not None else Int4Avx2Weight(self.source, xbits)
            elif k == "int8avx2":
                self.impl[k] = Int8Avx2Weight(self.source)
            elif k == "int8":
                self.impl[k] = Int8Weight(self.source, self.act_dtype)
            elif k == "onednn":
                self.impl[k] = torch.ops.mkldnn._reorder_linear_weight(self.float_weight(), 16)
            elif k in PLAIN_KERNELS:
                self.impl[k] = self.float_weight()
            else:
                raise ValueError(f"unknown kernel {k!r}")

    def finalize(self, plan: list[tuple[int, str]]) -> None:
        """Keep only the kernels `plan` uses; drop the source and any float copy no kernel needs."""
        used = {k for _, k in plan}
        self.build(used)
        self.impl = {k: v for k, v in self.impl.items() if k in used}
        self.plan = sorted(plan)
        self._float = None
        self.source = None

    def kernel_for(self, rows: int) -> str:
        for upto, k in self.plan:
            if rows <= upto:
                return k
        return self.plan[-1][1]

    def run(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        impl = self.impl[kernel]
        if kernel in INT_KERNELS:
            return impl(x)
        if kernel == "onednn":
            return onednn_linear(x, impl)
        if kernel == "linear":
            return F.linear(x, impl)
        return _mkl(impl, x)

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        k = self.kernel_for(x.shape[0])
        if k == "onednn" and residual is not None and x.dtype == torch.float32 and onednn_rows(x.shape[0]) == x.shape[0]:
            return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), residual, self.impl[k], b, "add")
        y = self.run(k, x)
        if b is not None:
            y = y + b
        return y if residual is None else residual + y

    def nbytes(self) -> int:
        total = 0
        for k, v in self.impl.items():
            if k == "int4":
                total += v.packed.numel() * v.packed.element_size() + v.sz.numel() * v.sz.element_size()
            elif k in ("int4dp", "int4amx"):
                total += v.codes.numel() * 4 + v.sm.numel() * 2
            elif k in ("int4avx2", "int4avx2-x8", "int8avx2"):
                if not (k == "int4avx2-x8" and "int4avx2" in self.impl):  # one packing for both
                    total += v.packed.numel()
            elif k == "int8":
                total += v.codes.numel() + v.scale.numel() * v.scale.element_size()
            elif k == "onednn":
                total += _onednn_bytes(v)
            elif k == next(p for p in PLAIN_KERNELS if p in self.impl):  # one plain copy for both
                total += v.numel() * v.element_size()
        return total


def _onednn_bytes(t: torch.Tensor) -> int:
    try:
        return t.numel() * t.element_size()
    except RuntimeError:  # an opaque mkldnn tensor
        return 0


class PlannedParts:
    """A matrix fused from parts of different formats that share an input (a GGUF's Q4_K q and
    k projections with its Q6_K v): each part a `PlannedLinear` on its own kernel and plan,
    their outputs side by side, as one product would give them."""

    __slots__ = ("parts", "shape")

    def __init__(self, parts: list[PlannedLinear]):
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("the parts of a fused matrix share their input width")
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.cat([p(x) for p in self.parts], dim=1)
        if b is not None:
            y = y + b
        return y if residual is None else residual + y

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)
