"""The integer kernel for 8-bit codes (`csrc/int8_avx2.c`, `int8x.py`, kernel `int8avx2`).

Its stated tolerance:
- against the float64 product of its own quantised inputs (W = s c from the codes and the
  scales it holds, x from its integer codes Q and steps dx): |y - ref| <= (T + 3) 2^-24 size
  per output, T the number of terms (groups of 32, or of 16 for a group-16 matrix), size =
  the sum of the terms' magnitudes |s dx E| (a rounding of s dx, one of E where |E| >= 2^24,
  one fused multiply-add per term);
- against the plain product x @ W.T: the activations' rounding, at most half a step per
  input, sum over groups of max|x_g| / (2 L) sum_g |w|, plus the above;
- a row's output is the same bits whatever rows, threads and instruction set share the call.

The AVX2 path (forced with TR_I4X_ISA=1), the AVX-VNNI one and the AVX-512 VNNI one run here
through builds of the same source (`build.variant`; AVX-512 as pairs of ymm where the host
lacks it), and the VNNI paths compile to vpdpwssd for CPUs that have them (`build.assembly`)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.intx import LEVELS, quantize_ref
from tokenrouter.runtime.kernels import build
from tokenrouter.runtime.kernels.int8x import Int8Avx2Weight, int8x_mm, int8x_pack, int8x_problem
from tokenrouter.runtime.kernels.linear import PlannedLinear
from tokenrouter.runtime.kernels.plan import measure, row_invariant
from tokenrouter.runtime.kernels.quant import QuantError, QuantTensor

HOST = int8x_problem()
pytestmark = pytest.mark.skipif(HOST is not None, reason=f"no integer kernels here: {HOST}")

VARIANTS = {"avx2": ("TR_I4X_ISA=1",), "vnni-emulated": ("TR_I4X_ISA=2", "TR_I4X_EMULATE_VNNI"),
            "avx512-emulated": ("TR_I4X_EMULATE_512",)}
PATHS = ["host", *VARIANTS]


def _lib(path: str):
    return None if path == "host" else build.variant(VARIANTS[path])


def q8(n: int, k: int, group: int, g: torch.Generator, lo: int = -128, hi: int = 127, half: bool = True) -> QuantTensor:
    """Codes in lo..hi, a positive or negative scale per group (float16 values when `half`:
    Q8_0 and Q5_0's d; Q6_K's d sc is not one)."""
    codes = torch.randint(lo, hi + 1, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, k // group, generator=g) - 0.3) * 0.02
    s = s.half().float() if half else s * (1 + 2.0 ** -13)
    return QuantTensor("q8", codes, s, None, group, "q8")


FORMATS = {  # name: (group, code range, float16 scales) as the GGUF types give them
    "q8_0": (32, (-128, 127), True), "q5_0": (32, (-16, 15), True), "q6_k": (16, (-32, 31), False),
}


def matrix(fmt: str, n: int, k: int, g: torch.Generator) -> QuantTensor:
    group, (lo, hi), half = FORMATS[fmt]
    return q8(n, k, group, g, lo, hi, half)


def _mm(qt, x, xbits=16, path="host", threads=None, out=None, packed=None):
    packed = int8x_pack(qt.codes, qt.scale, qt.group, lib=_lib(path)) if packed is None else packed
    return int8x_mm(x, packed, qt.shape[0], xbits, out=out, threads=threads, lib=_lib(path))


def reference(qt: QuantTensor, x: torch.Tensor, xbits: int):
    """(y, size, terms) in float64: the product of the weights as held and the quantised x."""
    n, k = qt.shape
    q, dx, _ = quantize_ref(x, xbits)
    per = 32 // qt.group
    e = torch.einsum("rti,nti->rnt", q.double().view(-1, k // qt.group, qt.group),
                     qt.codes.double().view(n, k // qt.group, qt.group))
    t = e * (qt.scale.double().unsqueeze(0) * dx.double().repeat_interleave(per, dim=1).unsqueeze(1))
    return t.sum(-1), t.abs().sum(-1), k // qt.group


def bound(size: torch.Tensor, terms: int) -> torch.Tensor:
    return (terms + 3) * 2.0 ** -24 * size + 1e-30


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 19), n=st.integers(1, 70), k32=st.integers(1, 12), fmt=st.sampled_from(list(FORMATS)),
       bf16=st.booleans(), path=st.sampled_from(PATHS), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       xbits=st.sampled_from([8, 16]), seed=st.integers(0, 10_000))
def test_the_product_is_the_float64_product_of_its_quantised_inputs(rows, n, k32, fmt, bf16, path, scale, xbits, seed):
    g = torch.Generator().manual_seed(seed)
    k = 32 * k32
    qt = matrix(fmt, n, k, g)
    x = torch.randn(rows, k, generator=g) * scale
    if bf16:
        x = x.to(torch.bfloat16)
    y = _mm(qt, x, xbits, path)
    ref, size, terms = reference(qt, x.float(), xbits)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    err = (y.double() - ref).abs()
    assert (err <= bound(size, terms)).all(), f"max err {err.max():.3g}, relative to size {(err / size).max():.3g}"


@pytest.mark.parametrize("xbits", [8, 16])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_against_the_plain_product_the_error_is_the_activations_rounding(fmt, xbits):
    g = torch.Generator().manual_seed(5)
    n, k = 96, 1536
    qt = matrix(fmt, n, k, g)
    x = torch.randn(6, k, generator=g).double()
    w = qt.dequantize().double()
    y = _mm(qt, x.float(), xbits).double()
    exact = x @ w.T
    amax = x.view(6, k // 32, 32).abs().amax(-1)
    rounding = (amax / (2 * LEVELS[xbits])) @ w.abs().view(n, k // 32, 32).sum(-1).T
    _, size, terms = reference(qt, x.float(), xbits)
    assert ((y - exact).abs() <= rounding + bound(size, terms)).all()
    assert ((y - exact).norm() / exact.norm()).item() < (0.02 if xbits == 8 else 1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_row_gets_the_same_bits_whatever_shares_the_call(fmt, path):
    """Rows 1..17 (row tiles of 8 and every remainder), threads 1, 2 and 3, an odd N: every row
    of every call equals the row computed alone."""
    g = torch.Generator().manual_seed(7)
    n, k = 203, 512
    qt = matrix(fmt, n, k, g)
    packed = int8x_pack(qt.codes, qt.scale, qt.group, lib=_lib(path))
    x = torch.randn(17, k, generator=g)
    alone = torch.cat([_mm(qt, x[r:r + 1], path=path, threads=1, packed=packed) for r in range(17)])
    for threads in (1, 2, 3):
        for rows in range(1, 18):
            assert torch.equal(_mm(qt, x[:rows], path=path, threads=threads, packed=packed), alone[:rows]), (rows, threads)
        assert torch.equal(_mm(qt, x.flip(0), path=path, threads=threads, packed=packed), alone.flip(0))


def test_every_path_gives_the_same_bits():
    """E is an exact integer on every path and the float steps per lane the same."""
    g = torch.Generator().manual_seed(8)
    for fmt in FORMATS:
        qt = matrix(fmt, 100, 384, g)
        x = torch.randn(13, 384, generator=g)
        host = _mm(qt, x)
        for path in VARIANTS:
            assert torch.equal(host, _mm(qt, x, path=path)), (fmt, path)


@pytest.mark.parametrize("march,register", [("alderlake", "%ymm"), ("icelake-server", "%zmm")])
def test_the_vnni_paths_compile_to_vpdpwssd(march, register):
    try:
        asm = build.assembly("int8_avx2.c", march)
    except build.NativeKernelError as e:
        pytest.skip(f"this compiler does not target {march}: {e}")
    lines = [ln for ln in asm.splitlines() if "vpdpwssd" in ln]
    assert lines and any(register in ln for ln in lines)


def test_scales_are_held_as_float16_only_where_that_is_exact():
    g = torch.Generator().manual_seed(9)
    exact, not_half = q8(16, 64, 32, g), q8(16, 64, 32, g, half=False)
    assert int8x_pack(exact.codes, exact.scale, 32).numel() == 64 + 2 * 544  # header, 2 blocks: codes + float16
    assert int8x_pack(not_half.codes, not_half.scale, 32).numel() == 64 + 2 * 576  # float32 scales
    x = torch.randn(3, 64, generator=g)
    ref, size, terms = reference(not_half, x, 16)
    assert ((_mm(not_half, x).double() - ref).abs() <= bound(size, terms)).all()


def test_an_odd_n_writes_only_its_columns_and_bad_arguments_are_refused():
    g = torch.Generator().manual_seed(2)
    qt = q8(9, 64, 16, g)
    big = torch.full((4, 30), 7.0)
    x = torch.randn(4, 64, generator=g)
    _mm(qt, x, out=big)
    assert torch.equal(big[:, 9:], torch.full((4, 21), 7.0)) and torch.equal(big[:, :9], _mm(qt, x))
    packed = int8x_pack(qt.codes, qt.scale, 16)
    with pytest.raises(ValueError, match="refused"):
        int8x_mm(torch.randn(2, 96), packed, 9)  # K of another matrix: the header says 64
    with pytest.raises(ValueError, match="refused"):
        int8x_mm(x, packed, 10)
    with pytest.raises(ValueError, match="group of 16 or 32"):
        int8x_pack(qt.codes, torch.ones(9, 1), 64)
    with pytest.raises(QuantError, match="8-bit codes"):
        Int8Avx2Weight(QuantTensor("q8", qt.codes, torch.ones(9, 1), None, 64, "int8"))


def test_the_plan_measures_it_for_q8_matrices_and_it_is_row_invariant():
    g = torch.Generator().manual_seed(12)
    lins = [PlannedLinear(matrix("q6_k", 64, 256, g), torch.bfloat16) for _ in range(2)]
    assert "int8avx2" in lins[0].candidates() and lins[0].key == "64x256:q8g16"
    assert "int8avx2" not in PlannedLinear(matrix("q6_k", 64, 256, g), torch.float32).candidates()
    lins[0].build(["int8avx2"])
    assert row_invariant(lins[0], "int8avx2")
    measure(lins, rounds=1, buckets=(1, 2))
    assert "int8avx2" in measure.last_timings["64x256:q8g16"]
