"""The integer kernels' activations as the tests reproduce them (`csrc/xquant.h`): float32
op for op, so the kernels' quantisation can be checked bit for bit."""

from __future__ import annotations

import torch

LEVELS = {8: 127.0, 16: 32258.0}


def quantize_ref(x: torch.Tensor, xbits: int):
    """(Q int32 [rows, K], dx, sx [rows, K / 32]): dx = amax / L, Q = round_half_even(x * (L /
    amax)), sx = dx sum Q, per row and group of 32."""
    rows, k = x.shape
    lv = LEVELS[xbits]
    xg = x.to(torch.float32).view(rows, k // 32, 32)
    a = xg.abs().amax(-1)
    inv = torch.where(a > 0, torch.tensor(lv) / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(a))
    q = torch.round(xg * inv.unsqueeze(-1)).to(torch.int32)
    dx = a / lv
    return q.view(rows, k), dx, dx * q.sum(-1).to(torch.float32)
