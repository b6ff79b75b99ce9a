"""Trained router networks and extra LM-head rows, loaded from safetensors (never pickle).

A router network (`ir.RouterNet`) is an MLP: tensors `layers.{i}.weight` [out, in] and
`layers.{i}.bias` [out], the activation between layers, one sigmoid output (or a softmax
and one index of it). Its input is the concatenation of the declared inputs, so the first
layer's width is checked against that declared layout here, at load time: a file that does
not fit is a `RouterWeightsError` naming the file, the tensor, the expected and the found
shape, before any request is served.

A head row (`ir.HeadLogit`, Co-LLM's defer head) is `weight` [H] or [1, H] and an optional
`bias` [1], applied to the final hidden state.
"""

from __future__ import annotations

import os
import re

import torch
from torch import nn

from tokenrouter.compiler import ir

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}
_LAYER_KEY = re.compile(r"layers\.(\d+)\.(weight|bias)")


class RouterWeightsError(ValueError):
    """A router weights file is missing, unreadable, or does not fit its declaration."""


def input_width(router: ir.RouterNet) -> int:
    """Width of the router's input vector: the sum of its declared inputs' widths."""
    width = 0
    for inp in router.inputs:
        if isinstance(inp, (ir.InputHidden, ir.InputTokenEmbedding)):
            width += inp.dim
        elif isinstance(inp, ir.InputTopkLogits):
            width += inp.k
        else:
            width += 1
    return width


def resolve(path: str, base_dir: str | None) -> str:
    """A weights path as written in the program, relative to `base_dir` when not absolute."""
    return path if os.path.isabs(path) or not base_dir else os.path.join(base_dir, path)


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, with a clear error when that is impossible."""
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        raise RouterWeightsError(f"{path}: no such weights file")
    try:
        return load_file(path)
    except Exception as exc:  # a truncated, corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None


class RouterMLP(nn.Module):
    """The router network: input [B, in] -> probability [B]; NaN for a non-finite input row."""

    def __init__(self, sizes: list[int], activation: str, output_index: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = _ACTIVATIONS[activation]()
        self.output_index = output_index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.layers[0].in_features:
            raise ValueError(f"router input has width {x.shape[-1]}, its declared layout "
                             f"{self.layers[0].in_features}")
        bad = ~torch.isfinite(x).all(-1)
        x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        p = torch.sigmoid(x[:, 0]) if x.shape[-1] == 1 else torch.softmax(x, -1)[:, self.output_index]
        return p.masked_fill(bad, float("nan"))


def _check(path: str, name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise RouterWeightsError(
            f"{path}: tensor '{name}' has shape {list(tensor.shape)}, expected {list(expected)}")


def load_router_net(router: ir.RouterNet, base_dir: str | None = None,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> RouterMLP:
    """Load and check one router network; see the module docstring."""
    path = resolve(router.file, base_dir)
    if any(isinstance(i, (ir.InputHidden, ir.InputTokenEmbedding)) and i.dim <= 0 for i in router.inputs):
        raise RouterWeightsError(
            f"router '{router.name}': the input widths of model '{router.model}' are unknown "
            f"(load the program with its models resolved, frontend.load_program)")
    tensors = read_tensors(path)
    indices = set()
    for key in tensors:
        m = _LAYER_KEY.fullmatch(key)
        if not m:
            raise RouterWeightsError(
                f"{path}: unexpected tensor '{key}' (a router network holds only "
                f"'layers.<i>.weight' and 'layers.<i>.bias')")
        indices.add(int(m.group(1)))
    n = len(indices)
    if n == 0 or indices != set(range(n)):
        raise RouterWeightsError(f"{path}: layers must be numbered 0..n-1, found {sorted(indices)}")
    sizes = [input_width(router)]
    for i in range(n):
        w_key, b_key = f"layers.{i}.weight", f"layers.{i}.bias"
        if w_key not in tensors:
            raise RouterWeightsError(f"{path}: tensor '{w_key}' is missing")
        if b_key not in tensors:
            raise RouterWeightsError(f"{path}: tensor '{b_key}' is missing")
        w = tensors[w_key]
        if w.dim() != 2:
            raise RouterWeightsError(f"{path}: tensor '{w_key}' has shape {list(w.shape)}, expected 2 dimensions")
        _check(path, w_key, w, (w.shape[0], sizes[-1]))
        _check(path, b_key, tensors[b_key], (w.shape[0],))
        sizes.append(w.shape[0])
    if sizes[-1] > 1 and not 0 <= router.output_index < sizes[-1]:
        raise RouterWeightsError(
            f"{path}: output_index {router.output_index} is out of range for {sizes[-1]} outputs")
    net = RouterMLP(sizes, router.activation, router.output_index)
    with torch.no_grad():
        for i, layer in enumerate(net.layers):
            layer.weight.copy_(tensors[f"layers.{i}.weight"])
            layer.bias.copy_(tensors[f"layers.{i}.bias"])
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_head(head: ir.HeadLogit, hidden_size: int | None = None, base_dir: str | None = None,
              device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one extra LM-head row as (weight [H], bias [] ); checks H when it is known."""
    path = resolve(head.file, base_dir)
    tensors = read_tensors(path)
    extra = sorted(set(tensors) - {"weight", "bias"})
    if extra:
        raise RouterWeightsError(f"{path}: unexpected tensor '{extra[0]}' (a head row holds 'weight' and 'bias')")
    if "weight" not in tensors:
        raise RouterWeightsError(f"{path}: tensor 'weight' is missing")
    w = tensors["weight"]
    h = hidden_size if hidden_size is not None else w.shape[-1]
    if tuple(w.shape) not in ((h,), (1, h)):
        raise RouterWeightsError(f"{path}: tensor 'weight' has shape {list(w.shape)}, expected [{h}] or [1, {h}]")
    b = tensors.get("bias", torch.zeros(1))
    _check(path, "bias", b.reshape(b.shape), (1,))
    return (w.reshape(-1).to(device=device, dtype=dtype), b.reshape(()).to(device=device, dtype=dtype))
