"""The decoder's building blocks: every linear path computes x @ W.T (+ b, + residual) and
returns a contiguous tensor; interleaved rotary equals Hugging Face's rotate_half."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.layers import LinearWeight, Rotary, interleave, linear
from tokenrouter.runtime.kernels.linear import PlannedLinear, onednn_rows
from tokenrouter.runtime.kernels.plan import fixed_plan


def _weight(w: torch.Tensor, path: str):
    """`w` as the engine holds it on `path`: F.linear (float64, other devices) or one of the
    float kernels a CPU float32 model's measured plan picks from."""
    if path == "plain":
        return LinearWeight(w)
    lin = PlannedLinear(w, w.dtype)
    if path not in lin.candidates():
        pytest.skip(f"{path} is not available in this torch build")
    lin.finalize(fixed_plan(path))
    return lin


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 16, 40])
@pytest.mark.parametrize("dtype,path", [(torch.float64, "plain"), (torch.float32, "plain"), (torch.float32, "linear"),
                                        (torch.float32, "mkl"), (torch.float32, "onednn")])
def test_linear_paths_agree_and_stay_contiguous(rows, dtype, path):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g, dtype=dtype)
    b = torch.randn(96, generator=g, dtype=dtype)
    res = torch.randn(rows, 96, generator=g, dtype=dtype)
    x = torch.randn(rows, 64, generator=g, dtype=dtype)
    lw = _weight(w, path)
    want = x.double() @ w.double().T
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    for got, ref in ((linear(x, lw), want), (linear(x, lw, b), want + b.double()),
                     (linear(x, lw, residual=res), want + res.double()),
                     (linear(x, lw, b, residual=res), want + b.double() + res.double())):
        assert got.shape == (rows, 96) and got.dtype == dtype
        # a strided output once sent a later projection down a 4x slower MKL path
        assert got.is_contiguous()
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=tol)


def _rotate_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interleaved_rotary_is_rotate_half_bit_for_bit(dtype):
    heads, hd, t = 5, 64, 9
    rot = Rotary(hd, 10000.0, None, 64, "cpu", dtype)
    positions = torch.tensor([0, 1, 2, 7, 8, 30, 31, 40, 63])
    x = torch.randn(t, heads, hd, dtype=dtype)
    cos = torch.cat([rot.cis.real, rot.cis.real], -1)[positions].unsqueeze(1)
    sin = torch.cat([rot.cis.imag, rot.cis.imag], -1)[positions].unsqueeze(1)
    want = _rotate_half_reference(x, cos, sin)
    perm = interleave(torch.arange(hd), 1)  # the model's order of a head's dimensions
    xi = x[..., perm].contiguous()
    rot.apply_(xi, rot.tables(positions))
    assert torch.equal(xi, want[..., perm])

def test_interleave_pairs_dimension_i_with_i_plus_half():
    w = torch.arange(2 * 8).reshape(2 * 8, 1).float()  # two heads of 8 rows
    out = interleave(w, 2).flatten().tolist()
    assert out == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_onednn_runs_a_bounded_set_of_row_counts_and_pads_them_exactly():
    """oneDNN keeps memory per row count it has seen: a server's batches must map onto a
    bounded set, with few padding rows, and padding must not change the real rows' values."""
    counts = {onednn_rows(t) for t in range(3, 4097)}
    assert len(counts) <= 16 + 28 + 56
    for t in range(3, 4097):
        m = onednn_rows(t)
        assert t <= m <= t + (3 if t <= 64 else 15 if t <= 512 else 63)
    w = torch.randn(96, 64)
    lw = _weight(w, "onednn")
    b, res = torch.randn(96), torch.randn(37, 96)
    x = torch.randn(37, 64)  # 37 rows run as 40
    torch.testing.assert_close(linear(x, lw, b, residual=res), res + x @ w.T + b, rtol=1e-5, atol=1e-5)
