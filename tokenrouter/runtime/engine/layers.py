"""The small numerical building blocks of the decoder: linear, RMSNorm, rotary embedding.

They follow Hugging Face `transformers` operation by operation (RMSNorm in float32, RoPE
tables computed in float32), so float32/float64 logits agree with the reference to
rounding. `linear` picks the matrix-multiply path by measurement over a whole model's
weights streaming from memory, as in a real step (`python benchmarks/bench_linear.py`,
cold section, 2 threads): one or two rows go through MKL as `W @ x.T` with the weight in
its natural [out, in] layout (one row padded to two real rows: MKL's one-row path is
slower), 2.5-4.5x faster than `F.linear` and 1.2-1.5x faster than oneDNN; from three rows
a float32 weight reordered once for oneDNN (`LinearWeight.packed`) wins, 1.1-1.8x over the
MKL layouts at 4-64 rows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Without oneDNN (1-2 rows, float64, other devices): rows at or above this use F.linear;
# below, `W @ x.T`, which won 1.4-3x at 2-8 rows and is even at 16-32 here.
_SMALL_ROWS = 16
# With a packed weight: rows at or above this use it (at 3 rows the two paths are even).
_PACKED_ROWS = 3
# The row count oneDNN chooses the packed layout for. Measured over the whole model's
# weights (cold): a layout for 16 rows runs 3-64 row steps 6-11% faster than the default
# (no hint), and 512-row prefills the same.
_PACK_FOR_ROWS = 16


class LinearWeight:
    """A linear layer's weight `w` [out, in], plus, for float32 on CPU, a copy reordered
    once into oneDNN's blocked layout (None where oneDNN is unavailable or the dtype is
    not float32, e.g. the float64 parity runs)."""

    __slots__ = ("w", "packed")

    def __init__(self, w: torch.Tensor):
        self.w = w
        self.packed = None
        if w.device.type == "cpu" and w.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_FOR_ROWS)
            except (RuntimeError, AttributeError):  # a torch build without the op: plain path
                self.packed = None


def linear(x: torch.Tensor, lw: LinearWeight, b: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T + b (+ residual) for x [T, in], w [out, in], choosing the faster CPU layout.
    With oneDNN the residual add is fused into the matrix multiply. A quantised model's
    matrices (`kernels.PlannedLinear`) run their own measured plan."""
    if type(lw) is not LinearWeight:
        return lw(x, b, residual)
    t = x.shape[0]
    if lw.packed is not None and t >= _PACKED_ROWS:
        if residual is not None and onednn_rows(t) == t:  # no padding: the add fused in
            return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), residual, lw.packed, b, "add")
        y = onednn_linear(x, lw.packed, b)
        return y if residual is None else residual + y
    y = _plain_linear(x, lw.w, b)
    return y if residual is None else residual + y


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


def _plain_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    t = x.shape[0]
    if x.device.type != "cpu" or t >= _SMALL_ROWS:
        return F.linear(x, w, b)
    if t == 1:
        # two real rows (a stride-0 expand leaves the BLAS path); outputs are kept contiguous:
        # a transposed output propagates through the residual stream and, measured, put a
        # later projection on a 4x slower MKL path
        y = (w @ x.repeat(2, 1).T)[:, 0].contiguous().unsqueeze(0)
    else:
        y = (w @ x.contiguous().T).T.contiguous()
    return y if b is None else y + b


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 (float64 stays float64) as HF does.
    torch's fused kernel gives the same bits as HF's op-by-op version in float32/64."""
    dt = x.dtype
    if dt in (torch.float32, torch.float64):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(dt)
    return h if weight is None else weight * h


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused [T, 2*I] gate|up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _inv_freq(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32, as HF) and the cos/sin scale for the supported RoPE types."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    raise ValueError(f"unsupported rope scaling {kind!r}; supported: default, linear, llama3")


class Rotary:
    """Rotary position embedding as one complex multiply per step.

    Hugging Face rotates dimension i of a head together with dimension i + head_dim/2
    (`rotate_half`). The model stores q and k with each head's dimensions interleaved
    instead (`interleave`: i -> 2i, i + head_dim/2 -> 2i + 1), so each rotated pair is
    one complex number and the rotation is `x * (cos + i sin)`: the same products and
    sums as `rotate_half` (bit-identical here), in one kernel instead of six. Attention
    only takes dot products of q with k, which the shared permutation leaves unchanged.
    The tables are computed in float32 as HF does, then cast."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_len: int,
                 device: torch.device | str, dtype: torch.dtype):
        inv, scale = _inv_freq(head_dim, theta, scaling)
        freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        cos = (freqs.cos() * scale).to(device=device, dtype=dtype)
        sin = (freqs.sin() * scale).to(device=device, dtype=dtype)
        self.cis = torch.complex(cos, sin)  # [max_len, head_dim / 2]
        self.head_dim = head_dim

    def tables(self, positions: torch.Tensor) -> torch.Tensor:
        """cos + i sin of shape [T, 1, head_dim / 2] for the given positions (once per step)."""
        return self.cis[positions].unsqueeze(1)

    def apply_(self, x: torch.Tensor, cis: torch.Tensor) -> None:
        """Rotate x [T, heads, head_dim] (interleaved layout) in place by its positions."""
        t, heads, hd = x.shape
        torch.view_as_complex(x.view(t, heads, hd // 2, 2)).mul_(cis)


def interleave(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's rows (dim 0) from HF's halves layout to interleaved pairs."""
    rest = w.shape[1:]
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()
