"""Trained router networks and extra LM-head rows, loaded from safetensors (never pickle).

A router network (`ir.RouterNet`) reads the concatenation of its declared inputs and
outputs one probability. Its `arch` fixes the tensor layout of the file:

- `mlp`: `layers.{i}.weight` [out, in], `layers.{i}.bias` [out] for i = 0..n-1, the
  activation between layers, one sigmoid output (or a softmax and one index of it).
- `citer` (CITER, Zheng et al. 2025): the same tensors with exactly three layers
  h -> 2h -> h -> 1, ReLU. CITER trains h -> 2h -> h with BatchNorm after each hidden linear
  layer; in inference mode a BatchNorm is an affine map, so `fit` folds it into the linear
  layer before it and the file holds plain linear layers (`fold_batchnorm`).
- `r2r` (R2R, Fu et al. 2025): per input j an optional projection `inputs.{j}.weight`
  [P_j, d_j] / `inputs.{j}.bias` [P_j] (absent: the input passes through; R2R projects its
  top-100 logits to the hidden width this way), the projected inputs concatenated, then
  `proj.weight` [D, sum P_j] / `proj.bias` [D], residual blocks i = 0..n-1
  `x + down(act(up(LayerNorm_i(x))))` with `blocks.{i}.norm.{weight,bias}` [D],
  `blocks.{i}.up.{weight,bias}` [F, D]/[F], `blocks.{i}.down.{weight,bias}` [D, F]/[D],
  a final LayerNorm `norm.{weight,bias}` [D] and one logit `out.weight` [1, D] /
  `out.bias` [1]; probability = sigmoid. (R2R's own code has 6 blocks of width 1024 and
  expansion 4; the width and block count are read from the file.) LayerNorm eps is 1e-5.

A head row (Co-LLM's defer head, an extra row of the small model's LM head) is `weight` [H]
or [1, H] and an optional `bias` [1], applied to the final hidden state.

Files written by `tokenrouter fit` carry metadata: `tokenrouter.arch` (the architecture,
`co_llm` for a head row), `tokenrouter.inputs` (the input layout, `layout_text`), the
chosen threshold and its direction, training figures, and fingerprints of both models
(`folder_fingerprint`). `file_problems`/`head_problems` compare a file's header with a
declaration; `tokenrouter check` reports them at the declaration (file:line:col) and the
loader refuses such a file (`RouterWeightsError` naming the file, the tensor, the expected
and the found shape) before any request is served.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file
from torch import nn

from tokenrouter.compiler import ir
# the file-level API (torch-free, in weights/files.py), also importable from here
from tokenrouter.compiler.weights.files import (DERIVED_IDENTITY, LN_EPS, META_ARCH, META_DIRECTION,  # noqa: F401
                                                META_INPUTS, META_MODELS, META_THRESHOLD, META_TRAINING,
                                                RouterWeightsError, arch_metadata, file_problem, file_problems,
                                                folder_fingerprint,
                                                head_problems, input_width, input_widths, layout_text, read_header,
                                                resolve)

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, with a clear error when that is impossible."""
    why = file_problem(path)
    if why is not None:
        raise RouterWeightsError(f"{path}: {why}")
    try:
        return load_file(path)
    except Exception as exc:  # a truncated, corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None


class RouterMLP(nn.Module):
    """arch mlp / citer: input [B, in] -> probability [B]; NaN for a non-finite input row."""

    def __init__(self, sizes: list[int], activation: str, output_index: int = 0):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = _ACTIVATIONS[activation]()
        self.output_index = output_index

    @property
    def in_features(self) -> int:
        return self.layers[0].in_features

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x

    def logit(self, x: torch.Tensor) -> torch.Tensor:
        return self.scores(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, bad = _clean(self, x)
        z = self.scores(x)
        p = torch.sigmoid(z[:, 0]) if z.shape[-1] == 1 else torch.softmax(z, -1)[:, self.output_index]
        return p.masked_fill(bad, float("nan"))


class RouterResidual(nn.Module):
    """arch r2r (see the module docstring): input [B, sum d_j] -> probability [B]."""

    def __init__(self, widths: list[int], projections: list[int | None], dim: int, ffn: list[int],
                 activation: str, dropout: float = 0.0):
        super().__init__()
        self.widths = list(widths)
        self.inputs = nn.ModuleDict({str(j): nn.Linear(d, p) for j, (d, p) in enumerate(zip(widths, projections))
                                     if p is not None})
        cat = sum(p if p is not None else d for d, p in zip(widths, projections))
        self.proj = nn.Linear(cat, dim)
        self.blocks = nn.ModuleList(_Block(dim, f, activation, dropout) for f in ffn)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.out = nn.Linear(dim, 1)

    @property
    def in_features(self) -> int:
        return sum(self.widths)

    def logit(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.split(x, self.widths, -1))
        for j, layer in self.inputs.items():
            parts[int(j)] = layer(parts[int(j)])
        x = self.proj(torch.cat(parts, -1))
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, bad = _clean(self, x)
        return torch.sigmoid(self.logit(x)).masked_fill(bad, float("nan"))


class _Block(nn.Module):
    def __init__(self, dim: int, ffn: int, activation: str, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.up = nn.Linear(dim, ffn)
        self.act = _ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(self.act(self.up(self.norm(x)))))


def _clean(net, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[-1] != net.in_features:
        raise ValueError(f"router input has width {x.shape[-1]}, its declared layout {net.in_features}")
    bad = ~torch.isfinite(x).all(-1)
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), bad


def build_net(router: ir.RouterNet, shapes: dict[str, tuple[int, ...]], dropout: float = 0.0) -> nn.Module:
    """An untrained network of the architecture and sizes `shapes` describes (checked first)."""
    if router.arch == "r2r":
        widths = input_widths(router)
        proj = [shapes[f"inputs.{j}.weight"][0] if f"inputs.{j}.weight" in shapes else None
                for j in range(len(widths))]
        n = len({k.split(".")[1] for k in shapes if k.startswith("blocks.")})
        return RouterResidual(widths, proj, shapes["proj.weight"][0],
                              [shapes[f"blocks.{i}.up.weight"][0] for i in range(n)], router.activation, dropout)
    n = len({k for k in shapes if k.endswith(".weight")})
    sizes = [input_width(router)] + [shapes[f"layers.{i}.weight"][0] for i in range(n)]
    return RouterMLP(sizes, router.activation, router.output_index)


def load_router_net(router: ir.RouterNet, base_dir: str | None = None,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load and check one router network; see the module docstring."""
    path = resolve(router.file, base_dir)
    if any(w <= 0 for w in input_widths(router)):
        raise RouterWeightsError(
            f"router '{router.name}': the input widths of model '{router.model}' are unknown "
            f"(load the program with its models resolved, pipeline.load_program)")
    meta, shapes = read_header(path)
    problems = file_problems(router, meta, shapes)
    if problems:
        raise RouterWeightsError(f"{path}: {problems[0]}")
    tensors = read_tensors(path)
    net = build_net(router, shapes)
    state = net.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            value.copy_(tensors[key])
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_head(head: ir.HeadLogit, hidden_size: int | None = None, base_dir: str | None = None,
              device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one extra LM-head row as (weight [H], bias [] ); checks H when it is known."""
    path = resolve(head.file, base_dir)
    meta, shapes = read_header(path)
    problems = head_problems(meta, shapes, hidden_size)
    if problems:
        raise RouterWeightsError(f"{path}: {problems[0]}")
    tensors = read_tensors(path)
    w = tensors["weight"]
    b = tensors.get("bias", torch.zeros(1))
    return (w.reshape(-1).to(device=device, dtype=dtype), b.reshape(()).to(device=device, dtype=dtype))


# ------------------------------------------------------------------ making files


def fold_batchnorm(linear: nn.Linear, bn: nn.BatchNorm1d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the one linear layer equal to `bn(linear(x))` in inference mode."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return linear.weight * scale[:, None], (linear.bias - bn.running_mean) * scale + bn.bias


def random_tensors(router: ir.RouterNet, generator: torch.Generator, width: int = 8, blocks: int = 2,
                   hidden_size: int = 16) -> dict[str, torch.Tensor]:
    """Random weights of the declared architecture (tests; `fit` starts from torch's init).
    mlp: in -> width -> 1 (or 2 outputs when output_index > 0); citer: h -> 2h -> h -> 1;
    r2r: top-k inputs projected to the widest other input, dim `width`, `blocks` blocks."""
    g = generator

    def lin(out: int, inp: int, prefix: str, t: dict) -> None:
        t[f"{prefix}.weight"] = torch.randn(out, inp, generator=g) / inp ** 0.5
        t[f"{prefix}.bias"] = torch.randn(out, generator=g) * 0.1

    t: dict[str, torch.Tensor] = {}
    widths = input_widths(router)
    if router.arch == "mlp":
        sizes = [sum(widths), width, 2 if router.output_index else 1]
    elif router.arch == "citer":
        h = sum(widths)
        sizes = [h, 2 * h, h, 1]
    else:
        hid = max([w for i, w in zip(router.inputs, widths) if not isinstance(i, ir.InputTopkLogits)] or [hidden_size])
        cat = 0
        for j, (inp, d) in enumerate(zip(router.inputs, widths)):
            if isinstance(inp, ir.InputTopkLogits):
                lin(hid, d, f"inputs.{j}", t)
                cat += hid
            else:
                cat += d
        lin(width, cat, "proj", t)
        for i in range(blocks):
            t[f"blocks.{i}.norm.weight"] = 1 + 0.1 * torch.randn(width, generator=g)
            t[f"blocks.{i}.norm.bias"] = 0.1 * torch.randn(width, generator=g)
            lin(4 * width, width, f"blocks.{i}.up", t)
            lin(width, 4 * width, f"blocks.{i}.down", t)
        t["norm.weight"] = 1 + 0.1 * torch.randn(width, generator=g)
        t["norm.bias"] = 0.1 * torch.randn(width, generator=g)
        lin(1, width, "out", t)
        return t
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        lin(b, a, f"layers.{i}", t)
    return t
