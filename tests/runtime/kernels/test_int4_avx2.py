"""The integer int4 kernel (`csrc/int4_avx2.c`, `quant.Int4Avx2Weight`, kernel `int4avx2`).

Its stated tolerance:
- against the float64 product of its own quantised inputs (W from the float16 s and m, x from
  its integer codes Q and steps dx): |y - ref| <= (2 G + 2) 2^-24 size per output, G = K / 32
  groups, size = sum over groups of |s dx D| + |m sx| (2 G fused multiply-adds and one rounding
  of s dx per group, each at most half an ulp of a partial sum bounded by size);
- against the plain product x @ W.T: the activations' rounding, at most half a step per input,
  sum over groups of max|x_g| / (2 L) sum_g |w| (L = 32258 for 16 bits, 127 for 8), plus the
  above. Relative error measured on SmolLM2's matrices: 2.0e-5 to 2.8e-5 (16 bits), 5.2e-3
  (8 bits), against 1.6e-3 for rounding x to bfloat16 alone (what torch's int4 kernel does);
- a row's output is the same bits whatever rows, threads and instruction set share the call.

The AVX-VNNI and AVX-512 VNNI paths cannot run on an AVX2-only host: they are run here through
two emulation builds of the same source (`build.variant`: vpdpbusd as maddubs + madd, 16 lanes
as two ymm), which keep their indexing and order, and compiled for those CPUs to check they
hold vpdpbusd (`build.assembly`)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.intx import LEVELS, quantize_ref
from tokenrouter.runtime.kernels import bindings, build
from tokenrouter.runtime.kernels.linear import PlannedLinear
from tokenrouter.runtime.kernels.plan import choose, measure, pick_kernel, row_invariant
from tokenrouter.runtime.kernels.quant import QuantTensor, int4avx2_problem, scale_and_min

HOST = bindings.int4x_problem()
pytestmark = pytest.mark.skipif(HOST is not None, reason=f"no integer int4 kernel here: {HOST}")

EMULATIONS = {"vnni-emulated": ("TR_I4X_ISA=2", "TR_I4X_EMULATE_VNNI"), "avx512-emulated": ("TR_I4X_EMULATE_512",)}
PATHS = ["host", *EMULATIONS]


def _lib(path: str):
    return None if path == "host" else build.variant(EMULATIONS[path])


def _packed(qt: QuantTensor, path: str = "host") -> torch.Tensor:
    return bindings.int4x_pack(qt.codes, *scale_and_min(qt), lib=_lib(path))


def _mm(qt_or_packed, x, xbits=16, path="host", threads=None, n=None, out=None):
    packed = qt_or_packed if isinstance(qt_or_packed, torch.Tensor) else _packed(qt_or_packed, path)
    n = n if n is not None else qt_or_packed.shape[0]
    return bindings.int4x_mm(x, packed, n, xbits, out=out, threads=threads, lib=_lib(path))


# ------------------------------------------------------------------ GGUF-style matrices

def q4_0(n: int, k: int, g: torch.Generator) -> QuantTensor:
    """Q4_0: w = d (q - 8), d float16 as in the file (no min)."""
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    return QuantTensor("q4", codes, d, None, 32, "Q4_0")


def q4_1(n: int, k: int, g: torch.Generator) -> QuantTensor:
    """Q4_1: w = d q + m, float16 d and m (quant's zero = m + 8 d)."""
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    mn = (-(torch.rand(n, k // 32, generator=g) * 0.2)).half().float()
    return QuantTensor("q4", codes, d, mn + 8.0 * d, 32, "Q4_1")


def q4_k(n: int, k: int, g: torch.Generator) -> QuantTensor:
    """Q4_K as the loader maps it: per sub-block of 32, scale = d sc and zero = 8 scale - dmin mn,
    with float16 d, dmin per 256 weights and 6-bit sc, mn per 32."""
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 256, 1, generator=g) * 1e-3 + 1e-4).half().float()
    dmin = (torch.rand(n, k // 256, 1, generator=g) * 1e-3 + 1e-4).half().float()
    sc = torch.randint(0, 64, (n, k // 256, 8), generator=g).float()
    mn = torch.randint(0, 64, (n, k // 256, 8), generator=g).float()
    scale = (d * sc).view(n, k // 32)
    return QuantTensor("q4", codes, scale, 8.0 * scale - (dmin * mn).view(n, k // 32), 32, "Q4_K")


FORMATS = {"q4_0": q4_0, "q4_1": q4_1, "q4_k": q4_k}


# ------------------------------------------------------------------ references

def reference(qt: QuantTensor, x: torch.Tensor, xbits: int):
    """(y, size) in float64: the product of the float16 s, m weights and the quantised x (what
    the kernel computes up to float32 rounding), and the sum of its per-group term magnitudes."""
    n, k = qt.shape
    g = k // 32
    q, dx, sx = quantize_ref(x, xbits)
    s, m = (t.half().double() for t in scale_and_min(qt))
    dot = torch.einsum("rgi,ngi->rng", q.double().view(-1, g, 32), qt.codes.double().view(n, g, 32))
    t1 = dot * (s.unsqueeze(0) * dx.double().unsqueeze(1))
    t2 = m.unsqueeze(0) * sx.double().unsqueeze(1)
    return (t1 + t2).sum(-1), (t1.abs() + t2.abs()).sum(-1)


def bound(k: int, size: torch.Tensor) -> torch.Tensor:
    return (2 * (k // 32) + 2) * 2.0 ** -24 * size + 1e-30


def dequant16(qt: QuantTensor) -> torch.Tensor:
    """W in float64 from the float16 s and m the kernel holds."""
    n, k = qt.shape
    s, m = (t.half().double() for t in scale_and_min(qt))
    return (qt.codes.double().view(n, k // 32, 32) * s[..., None] + m[..., None]).view(n, k)


# ------------------------------------------------------------------ the activations

@pytest.mark.parametrize("xbits", [8, 16])
@pytest.mark.parametrize("bf16", [False, True])
def test_the_activations_are_quantised_as_the_reference_bit_for_bit(bf16, xbits):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 320, generator=g) * torch.logspace(-3, 3, 7).unsqueeze(1)
    x[2, 32:64] = 0.0  # a group of zeros: dx = 0, codes 0, sx = 0
    x[3, 0:32] = torch.linspace(-1, 1, 32)  # exact halves after scaling round to even
    x[4, 64] = 1e30
    if bf16:
        x = x.to(torch.bfloat16)
    for path in PATHS:
        q, dx, sx = bindings.int4x_quantize(x, xbits, lib=_lib(path))
        qr, dxr, sxr = quantize_ref(x.float(), xbits)
        assert torch.equal(q, qr) and torch.equal(dx, dxr) and torch.equal(sx, sxr)
        assert int(q.abs().max()) <= LEVELS[xbits]
    assert float(dx[2, 1]) == 0.0 and float(sx[2, 1]) == 0.0


# ------------------------------------------------------------------ the product

@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 20), n=st.integers(1, 80), k32=st.integers(1, 16), fmt=st.sampled_from(["q4_0", "q4_1"]),
       bf16=st.booleans(), path=st.sampled_from(PATHS), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       xbits=st.sampled_from([8, 16]), seed=st.integers(0, 10_000))
def test_the_product_is_the_float64_product_of_its_quantised_inputs(rows, n, k32, fmt, bf16, path, scale, xbits,
                                                                     seed):
    g = torch.Generator().manual_seed(seed)
    k = 32 * k32
    qt = FORMATS[fmt](n, k, g)
    x = torch.randn(rows, k, generator=g) * scale
    if bf16:
        x = x.to(torch.bfloat16)
    y = _mm(qt, x, xbits, path)
    ref, size = reference(qt, x.float(), xbits)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    err = (y.double() - ref).abs()
    assert (err <= bound(k, size)).all(), f"max err {err.max():.3g}, relative to size {(err / size).max():.3g}"


@pytest.mark.parametrize("xbits", [8, 16])
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k"])
def test_against_the_plain_product_the_error_is_the_activations_rounding(fmt, xbits):
    """y against x @ W.T in float64: within half a quantisation step per input, plus the float
    tolerance; 16 bits stays under 1e-4 relative, 8 bits under 2e-2."""
    g = torch.Generator().manual_seed(5)
    n, k = 96, 1536
    qt = FORMATS[fmt](n, k, g)
    assert int4avx2_problem(qt) is None
    x = torch.randn(6, k, generator=g).double()
    w = dequant16(qt)
    y = _mm(qt, x.float(), xbits).double()
    exact = x @ w.T
    amax = x.view(6, k // 32, 32).abs().amax(-1)
    rounding = (amax / (2 * LEVELS[xbits])) @ w.abs().view(n, k // 32, 32).sum(-1).T
    _, size = reference(qt, x.float(), xbits)
    assert ((y - exact).abs() <= rounding + bound(k, size)).all()
    assert ((y - exact).norm() / exact.norm()).item() < (0.02 if xbits == 8 else 1e-4)


@pytest.mark.parametrize("xbits", [8, 16])
def test_an_odd_n_writes_only_its_columns_and_a_strided_x_is_read_in_place(xbits):
    g = torch.Generator().manual_seed(2)
    for n in (1, 7, 9, 16, 17, 100):
        qt = q4_1(n, 64, g)
        wide = torch.randn(5, 100, generator=g)
        x = wide[:, 20:84]  # row stride 100
        big = torch.full((5, n + 20), 7.0)
        _mm(qt, x, xbits, out=big)
        assert torch.equal(big[:, n:], torch.full((5, 20), 7.0))  # the rest of each out row untouched
        assert torch.equal(big[:, :n], _mm(qt, x.contiguous(), xbits))
        ref, size = reference(qt, x, xbits)
        assert ((big[:, :n].double() - ref).abs() <= bound(64, size)).all()


def test_bad_arguments_are_refused_with_a_message():
    g = torch.Generator().manual_seed(3)
    qt = q4_1(16, 64, g)
    packed = _packed(qt)
    with pytest.raises(ValueError, match="do not match"):
        bindings.int4x_mm(torch.randn(2, 96), packed, 16)
    with pytest.raises(ValueError, match="xbits"):
        bindings.int4x_mm(torch.randn(2, 64), packed, 16, xbits=12)
    with pytest.raises(ValueError, match="contiguous rows"):
        bindings.int4x_mm(torch.randn(64, 2).T, packed, 16)
    with pytest.raises(ValueError, match="K % 32"):
        bindings.int4x_pack(torch.zeros(16, 40, dtype=torch.uint8), torch.ones(16, 1), None)


# ------------------------------------------------------------------ batch invariance

@pytest.mark.parametrize("xbits", [8, 16])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k"])
def test_each_row_gets_the_same_bits_whatever_shares_the_call(fmt, path, xbits):
    """Rows 1..17 (row tiles of 8 and every remainder), threads 1, 2 and 3 (uneven splits of the
    output tiles), an odd N: every row of every call equals the row computed alone."""
    g = torch.Generator().manual_seed(7)
    n, k = 203, 512
    packed = _packed(FORMATS[fmt](n, k, g), path)
    x = torch.randn(17, k, generator=g)
    alone = torch.cat([_mm(packed, x[r:r + 1], xbits, path, threads=1, n=n) for r in range(17)])
    for threads in (1, 2, 3):
        for rows in range(1, 18):
            assert torch.equal(_mm(packed, x[:rows], xbits, path, threads, n=n), alone[:rows]), (rows, threads)
        assert torch.equal(_mm(packed, x[5:17], xbits, path, threads, n=n), alone[5:17])  # rows in other tiles
        assert torch.equal(_mm(packed, x.flip(0), xbits, path, threads, n=n), alone.flip(0))


def test_the_avx2_and_both_vnni_paths_give_the_same_bits():
    """The dot products are exact integers and the float steps per lane the same, so the paths
    agree bit for bit (the real VNNI builds keep that structure: `test_the_vnni_paths_compile`)."""
    g = torch.Generator().manual_seed(8)
    qt = q4_1(100, 384, g)
    x = torch.randn(13, 384, generator=g)
    for xbits in (8, 16):
        host = _mm(qt, x, xbits)
        for path in EMULATIONS:
            assert torch.equal(host, _mm(qt, x, xbits, path)), (path, xbits)


@pytest.mark.parametrize("march,register", [("alderlake", "%ymm"), ("icelake-server", "%zmm")])
def test_the_vnni_paths_compile_to_vpdpbusd(march, register):
    """The AVX-VNNI (ymm) and AVX-512 VNNI (zmm) paths this host cannot run, compiled for CPUs
    that have them: their dot products are vpdpbusd on the expected registers."""
    try:
        asm = build.assembly("int4_avx2.c", march)
    except build.NativeKernelError as e:
        pytest.skip(f"this compiler does not target {march}: {e}")
    lines = [ln for ln in asm.splitlines() if "vpdpbusd" in ln]
    assert lines and any(register in ln for ln in lines)


def test_a_prefill_sized_call_and_the_head_shape_across_threads():
    g = torch.Generator().manual_seed(11)
    qt = q4_1(72, 320, g)
    x = torch.randn(70, 320, generator=g)  # row tiles of 8 and a remainder of 6
    y = _mm(qt, x)
    ref, size = reference(qt, x, 16)
    assert ((y.double() - ref).abs() <= bound(320, size)).all()
    for r in (0, 7, 8, 63, 69):
        assert torch.equal(_mm(qt, x[r:r + 1]), y[r:r + 1])
    head = _packed(q4_1(4096 + 8, 576, g))
    x = torch.randn(9, 576, generator=g)
    one = _mm(head, x, threads=1, n=4104)
    assert torch.equal(_mm(head, x, threads=2, n=4104), one)
    assert torch.equal(_mm(head, x[4:5], threads=2, n=4104), one[4:5])


# ------------------------------------------------------------------ in the plan

def test_the_plan_measures_it_and_never_the_opt_in_8_bit_mode():
    g = torch.Generator().manual_seed(12)
    lins = [PlannedLinear(q4_1(64, 256, g), torch.bfloat16) for _ in range(2)]
    assert {"int4avx2", "int4avx2-x8"} <= set(lins[0].candidates())
    lins[0].build(["int4avx2"])
    assert row_invariant(lins[0], "int4avx2")
    measure(lins, rounds=1, buckets=(1, 2))
    timed = measure.last_timings["64x256:q4g32"]
    assert "int4avx2" in timed and "int4avx2-x8" not in timed
    forced = choose(lins, "int4avx2-x8")  # named, it runs
    assert forced == {"64x256:q4g32": [(64, "int4avx2-x8")]}
    x = torch.randn(3, 256, generator=g)
    assert torch.equal(lins[0](x), _mm(lins[0].impl["int4avx2-x8"].packed, x, 8, n=64))


def test_a_rescored_head_measures_the_8_bit_mode_too():
    g = torch.Generator().manual_seed(13)
    head = PlannedLinear(q4_1(64, 256, g), torch.bfloat16, rescored=True)
    assert head.key == "64x256:q4g32:rescored" and "int4avx2-x8" in head.measurable()
    assert "int4avx2-x8" not in PlannedLinear(q4_1(64, 256, g), torch.bfloat16).measurable()
    measure([head], rounds=1, buckets=(1, 2))
    assert {"int4avx2", "int4avx2-x8"} <= set(measure.last_timings["64x256:q4g32:rescored"])


def test_within_the_margin_the_avx512_kernels_keep_their_place_and_int4avx2_beats_torch():
    rows = [1, 2]
    assert pick_kernel({"int4": {1: 1.0, 2: 1.0}, "int4avx2": {1: 1.08, 2: 1.08}}, rows) == "int4avx2"
    assert pick_kernel({"int4avx2": {1: 1.0, 2: 1.0}, "int4dp": {1: 1.05, 2: 1.05}}, rows) == "int4dp"
    assert pick_kernel({"int4avx2": {1: 1.0, 2: 1.0}, "int4dp": {1: 1.3, 2: 1.3}}, rows) == "int4avx2"
