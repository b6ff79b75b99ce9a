"""The C int4 kernel on AVX-512 bfloat16 dot products and on AMX tiles (`csrc/int4_matmul.c`,
`quant.Int4DotWeight`).

Its stated tolerance: x is rounded to bfloat16, the scales and mins to float16 (exact for
GGUF's Q4_0/Q4_1, which store them so); everything after is float32, so the output equals
the float64 product of those rounded values to within 1e-6 of sum |x| (|w| + 128 s) per
output: the codes enter the dot products as 128 + q, whose sums are 16-ish times the
weights' (measured: 6.6e-6 of sum |x| |w| at K = 32, 2.2e-7 at K = 1536, against bfloat16's
own 2e-3 per element of x). A row's output is the same bits whatever rows and threads
share the call."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrouter.runtime.kernels import bindings, build
from tokenrouter.runtime.kernels.linear import PlannedLinear
from tokenrouter.runtime.kernels.plan import choose, pick_kernel
from tokenrouter.runtime.kernels.quant import (Int4Avx2Weight, Int4DotWeight, QuantError, QuantTensor,
                                              int4avx2_problem, int4dp_problem, quantize_int4)

HOST = bindings.int4dp_problem()
needs_kernel = pytest.mark.skipif(HOST is not None, reason=f"no int4dp kernel here: {HOST}")
# the AVX-512 dot-product kernel, and its AMX-tile variant where this host has one
VARIANTS = [False] + ([True] if bindings.int4dp_problem(amx=True) is None else [])


def _reference(qt: QuantTensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_bf16 @ W.T, |x_bf16| @ (|W| + 128 s).T) in float64, W from the kernel's float16
    scales s and mins."""
    n, k = qt.shape
    s = qt.scale.half().double()
    zero = torch.zeros_like(qt.scale) if qt.zero is None else qt.zero
    m = (zero - 8 * qt.scale).half().double()
    w = (qt.codes.double().view(n, k // 32, 32) * s[..., None] + m[..., None]).view(n, k)
    bias = (128 * s.abs()).repeat_interleave(32, dim=1)
    xb = x.to(torch.bfloat16).double()
    return xb @ w.T, xb.abs() @ (w.abs() + bias).T


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), n16=st.integers(1, 8), k32=st.integers(1, 12), q4_0=st.booleans(),
       bf16_in=st.booleans(), amx=st.sampled_from(VARIANTS), seed=st.integers(0, 10_000))
def test_the_kernel_is_the_product_of_its_rounded_inputs(rows, n16, k32, q4_0, bf16_in, amx, seed):
    g = torch.Generator().manual_seed(seed)
    n, k = 16 * n16, 32 * k32
    qt = quantize_int4(torch.randn(n, k, generator=g) * 0.1)
    if q4_0:  # Q4_0's form: no min of its own (zero = 0)
        qt = QuantTensor("q4", qt.codes, qt.scale, None, 32, "Q4_0")
    x = torch.randn(rows, k, generator=g) * 3
    got = Int4DotWeight(qt, amx)(x.to(torch.bfloat16) if bf16_in else x)
    ref, size = _reference(qt, x)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert ((got.double() - ref).abs() <= 1e-6 * size + 1e-30).all(), f"max {(got.double() - ref).abs().max():.3g}"


@needs_kernel
@pytest.mark.parametrize("amx", VARIANTS)
@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_gets_the_same_bits_whatever_shares_the_call(threads, amx):
    g = torch.Generator().manual_seed(1)
    qt = quantize_int4(torch.randn(96, 320, generator=g))
    w = Int4DotWeight(qt, amx)
    x = torch.randn(37, 320, generator=g)  # rows in chunks of 8 (dp) or 16 (AMX), and a rest
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        full = w(x)
    finally:
        torch.set_num_threads(before)
    for r in range(37):
        assert torch.equal(w(x[r:r + 1]), full[r:r + 1])
    assert torch.equal(w(x[3:30]), full[3:30])  # rows 3.. in chunks that start elsewhere


@pytest.mark.parametrize("kernel,weight,problem,host", [
    ("int4dp", Int4DotWeight, int4dp_problem, HOST),
    ("int4avx2", Int4Avx2Weight, int4avx2_problem, bindings.int4x_problem())])
def test_scales_float16_cannot_hold_keep_the_matrix_off_the_kernel(kernel, weight, problem, host):
    """Both C int4 kernels hold s and m as float16 (`quant.float16_problem`), and round x
    themselves, so neither is a candidate where float32 activations ask for exactness."""
    if host is not None:
        pytest.skip(f"no {kernel} kernel here: {host}")
    qt = quantize_int4(torch.randn(32, 64))
    big = QuantTensor("q4", qt.codes, qt.scale * 1e6, qt.zero * 1e6, 32, "int4")
    assert "float16" in problem(big)
    with pytest.raises(QuantError, match="float16"):
        weight(big)
    assert kernel not in PlannedLinear(big, torch.bfloat16).candidates()
    assert kernel in PlannedLinear(qt, torch.bfloat16).candidates()
    assert kernel not in PlannedLinear(qt, torch.float32).candidates()


def test_the_packed_weights_must_match_the_matrix():
    if build.available() is not None:
        pytest.skip(build.available())
    with pytest.raises(ValueError, match="do not match"):
        bindings.int4dp_mm(torch.randn(2, 64), torch.zeros(1, 2, 4, 16, dtype=torch.int32),
                           torch.zeros(1, 1, 2, 16, dtype=torch.float16), 16)


def test_within_the_margin_the_more_exact_kernel_wins():
    rows = [1, 2]
    assert pick_kernel({"int4": {1: 1.0, 2: 1.0}, "int4dp": {1: 1.05, 2: 1.05}, "onednn": {1: 2, 2: 2}}, rows) == "int4dp"
    assert pick_kernel({"int4": {1: 1.0, 2: 1.0}, "int4dp": {1: 1.3, 2: 1.3}}, rows) == "int4"
    assert pick_kernel({"onednn": {1: 1.0, 2: 1.0}, "int4": {1: 1.08, 2: 1.08}}, rows) == "int4"
    assert pick_kernel({"onednn": {1: 1.0, 2: 1.0}, "int4": {1: 1.5, 2: 1.5}}, rows) == "onednn"


@needs_kernel
@pytest.mark.parametrize("plan", [None, "int4dp"])
def test_one_matrix_the_kernel_cannot_hold_keeps_its_whole_shape_off_it(plan):
    """A plan is per shape, but whether the C kernel takes a matrix depends on its scales:
    a shape whose matrices disagree runs a kernel all of them can (measured, or forced)."""
    good = quantize_int4(torch.randn(32, 64))
    bad = QuantTensor("q4", good.codes, good.scale * 1e6, good.zero * 1e6, 32, "int4")
    lins = [PlannedLinear(good, torch.bfloat16), PlannedLinear(bad, torch.bfloat16)]
    (kernels,) = {tuple(k for _, k in p) for p in choose(lins, plan).values()}
    assert not {"int4dp", "int4amx"} & set(kernels)
    x = torch.randn(3, 64)
    for lin in lins:
        assert lin(x).shape == (3, 32)
