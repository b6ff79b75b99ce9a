"""GGUF blocks read in place (`kernels/blocks.py`, `csrc/gguf_rows.c`) against the `gguf`
package's dequantisation, which is llama.cpp's reference in numpy.

The blocks are made here: the types the `gguf` package can write (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0) by quantising random floats with it; the K-quants (Q4_K, Q5_K, Q6_K), which it cannot
write, from random bytes whose float16 scales are overwritten with finite random values
(every bit pattern of the codes and 6-bit scales is a valid block)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from tokenrouter.runtime.kernels import bindings
from tokenrouter.runtime.kernels.blocks import CODED, GGML_TYPES, BlockRows, row_bytes
from tokenrouter.runtime.kernels.build import available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no C kernels here: {available()}")

WRITABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of each block's float16 fields (d, and dmin for Q4_K / Q5_K)
K_HALVES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def make_blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """uint8 [n, row bytes]: n rows of k weights of `kind`."""
    rng = np.random.default_rng(seed)
    if kind in WRITABLE:
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
        w[0, :32] = 0.0  # an all-zero block: d = 0
        return quantize(w, GGMLQuantizationType[kind]).reshape(n, -1)
    if kind in ("F16", "BF16", "F32"):
        w = rng.standard_normal((n, k)).astype(np.float32)
        if kind == "F32":
            return w.view(np.uint8)
        if kind == "F16":
            return w.astype(np.float16).view(np.uint8)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    _, per, size = GGML_TYPES[kind]
    b = rng.integers(0, 256, (n * k // per, size), dtype=np.uint8)
    for at in K_HALVES[kind]:
        halves = (rng.standard_normal(len(b)) * 1e-2).astype(np.float16)
        halves[::7] = np.float16(6e-6)  # subnormal float16 scales too
        b[:, at:at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return b.reshape(n, -1)


def gguf_values(kind: str, blocks: np.ndarray, k: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks.reshape(-1), GGMLQuantizationType[kind]).reshape(blocks.shape[0], k))


@pytest.mark.parametrize("kind", list(GGML_TYPES))
def test_rows_read_in_c_are_the_gguf_packages_values_bit_for_bit(kind):
    n, k = 37, 512
    blocks = make_blocks(kind, n, k, seed=GGML_TYPES[kind][0])
    assert blocks.shape == (n, row_bytes(kind, k))
    ref = gguf_values(kind, blocks, k)
    rows = BlockRows(kind, torch.from_numpy(blocks), (n, k))
    assert torch.equal(rows.dequantize(), ref)
    ids = torch.tensor([[5, 0, 36], [5, 5, 12]])  # any shape, repeats
    got = rows.dequantize(ids)
    assert got.shape == (2, 3, k) and torch.equal(got, ref[ids])
    with pytest.raises(IndexError, match="out of range"):
        rows.dequantize(torch.tensor([n]))


@pytest.mark.parametrize("kind", CODED)
def test_the_codes_the_integer_kernels_take_are_the_files_values(kind):
    """Q5_0, Q8_0 and Q6_K as int8 codes times float32 scales (group 32, 32, 16) give the file's
    values bit for bit; Q4_0 too; Q4_1 and Q4_K as (q - 8) scale + zero, which rounds once
    more than ggml's d q + m: within an ulp of the block's largest value."""
    n, k = 24, 768
    blocks = make_blocks(kind, n, k, seed=100 + GGML_TYPES[kind][0])
    ref = gguf_values(kind, blocks, k)
    qt = BlockRows(kind, torch.from_numpy(blocks), (n, k)).codes()
    assert qt.shape == (n, k) and qt.source == kind
    if kind in ("Q5_0", "Q8_0", "Q6_K"):
        assert (qt.fmt, qt.group, qt.codes.dtype) == ("q8", 16 if kind == "Q6_K" else 32, torch.int8)
        lo, hi = {"Q5_0": (-16, 15), "Q8_0": (-128, 127), "Q6_K": (-32, 31)}[kind]
        assert lo <= int(qt.codes.min()) and int(qt.codes.max()) <= hi
    if kind in ("Q4_1", "Q4_K"):
        tol = ref.abs().view(n, -1, 32).amax(-1, keepdim=True) * 2.0 ** -23
        assert ((qt.dequantize() - ref).view(n, -1, 32).abs() <= tol).all()
    else:
        assert torch.equal(qt.dequantize(), ref)
    assert BlockRows("Q5_1", torch.from_numpy(make_blocks("Q5_1", 2, 64, 0)), (2, 64)).codes() is None


def test_reordered_rows_move_whole_blocks():
    blocks = torch.from_numpy(make_blocks("Q6_K", 8, 256, 3))
    rows = BlockRows("Q6_K", blocks, (8, 256))
    flipped = rows.map_rows(lambda t: t.flip(0))
    assert torch.equal(flipped.dequantize(), rows.dequantize().flip(0))
    with pytest.raises(ValueError, match="uint8 \\[8, 210\\]"):
        BlockRows("Q6_K", blocks[:, :200], (8, 256))


@pytest.mark.parametrize("kind", ["Q8_0", "Q6_K", "Q5_0", "Q4_K"])
def test_rescoring_from_blocks_uses_the_files_values(kind):
    """The head's top candidates rescored from GGUF rows: the float64 product of the file's
    values and h to float32 rounding, the other logits untouched, each row alone; for Q8_0 the
    same bits as rescoring from its codes and scales."""
    g = torch.Generator().manual_seed(1)
    v, hdim, k = 300, 256, 16
    blocks = torch.from_numpy(make_blocks(kind, v, hdim, 7))
    rows = BlockRows(kind, blocks, (v, hdim))
    h = torch.randn(5, hdim, generator=g)
    lg = torch.randn(5, v, generator=g)
    before = lg.clone()
    bindings.rescore_top_blocks(lg, h, GGML_TYPES[kind][0], blocks, k)
    top = before.topk(k, dim=-1).indices
    exact = torch.einsum("rkh,rh->rk", rows.dequantize().double()[top], h.double())
    torch.testing.assert_close(lg.gather(1, top).double(), exact, rtol=1e-5, atol=1e-5)
    kept = torch.ones_like(lg, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(lg[kept], before[kept])
    for r in range(5):
        alone = before[r:r + 1].clone()
        bindings.rescore_top_blocks(alone, h[r:r + 1].clone(), GGML_TYPES[kind][0], blocks, k)
        assert torch.equal(alone, lg[r:r + 1])
    if kind == "Q8_0":
        qt = rows.codes()
        again = before.clone()
        bindings.rescore_top(again, h, qt.codes, qt.scale, k)
        assert torch.equal(again, lg)


def test_without_the_c_kernels_rows_are_read_by_the_gguf_package(monkeypatch):
    """Where no compiler builds the kernels, the rows come from the `gguf` package's numpy
    dequantisation: the same values."""
    from tokenrouter.runtime.kernels import blocks
    rows = BlockRows("Q6_K", torch.from_numpy(make_blocks("Q6_K", 6, 512, 11)), (6, 512))
    ids = torch.tensor([4, 0, 4])
    with_c = rows.dequantize(ids)
    monkeypatch.setattr(blocks, "available", lambda: "no C compiler (the test says so)")
    assert torch.equal(rows.dequantize(ids), with_c)
