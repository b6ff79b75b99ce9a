"""The small numerical building blocks of the decoder: linear, RMSNorm, rotary embedding.

They follow Hugging Face `transformers` operation by operation (RMSNorm in float32, RoPE
tables computed in float32), so float32/float64 logits agree with the reference to
rounding. `linear` runs a matrix as `kernels.linear.PlannedLinear` (every CPU float32 or
quantised model: the kernel per row count measured on the host) or, for float64 parity runs
and other devices, as a plain `LinearWeight` on `F.linear`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class LinearWeight:
    """A linear layer's weight `w` [out, in] run by `F.linear` (float64, other devices)."""

    __slots__ = ("w",)

    def __init__(self, w: torch.Tensor):
        self.w = w


def linear(x: torch.Tensor, lw, b: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T + b (+ residual) for x [T, in], w [out, in]. A measured matrix
    (`kernels.linear.PlannedLinear`) runs its own plan."""
    if type(lw) is not LinearWeight:
        return lw(x, b, residual)
    y = F.linear(x, lw.w, b)
    return y if residual is None else residual + y


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
