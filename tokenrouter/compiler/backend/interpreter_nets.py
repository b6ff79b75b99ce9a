"""The reference interpreter's router networks and head rows: weights read from safetensors
in float64 (once per file), each network written out for one request at a time in NumPy,
sharing no code with the batched networks of `weights/nets.py` (whose docstring gives each
architecture's tensor layout). A weights file that is missing or unreadable is a
`RouterWeightsError`, as when the generated module's networks load it.
"""

from __future__ import annotations

import math
import os

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf

from tokenrouter.compiler import ir
from tokenrouter.compiler.features.catalog import sigmoid
from tokenrouter.compiler.weights.files import RouterWeightsError

ACTIVATIONS = ("relu", "gelu", "silu", "tanh")


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh(x)
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # gelu, the exact (erf) form


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    return (x - mu) / math.sqrt(var + 1e-5) * w + b


def _r2r_logit(t: dict[str, np.ndarray], r: ir.RouterNet, cols: list[np.ndarray]) -> float:
    """R2R's classifier, written out one request at a time (layout: weights/nets.py)."""
    parts = []
    for j, c in enumerate(cols):
        if f"inputs.{j}.weight" in t:
            c = t[f"inputs.{j}.weight"] @ c + t[f"inputs.{j}.bias"]
        parts.append(c)
    x = t["proj.weight"] @ np.concatenate(parts) + t["proj.bias"]
    i = 0
    while f"blocks.{i}.up.weight" in t:
        y = _layer_norm(x, t[f"blocks.{i}.norm.weight"], t[f"blocks.{i}.norm.bias"])
        y = _activation(r.activation, t[f"blocks.{i}.up.weight"] @ y + t[f"blocks.{i}.up.bias"])
        x = x + t[f"blocks.{i}.down.weight"] @ y + t[f"blocks.{i}.down.bias"]
        i += 1
    x = _layer_norm(x, t["norm.weight"], t["norm.bias"])
    return float((t["out.weight"] @ x + t["out.bias"])[0])


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        return {k: np.asarray(v, dtype=np.float64) for k, v in load_file(path).items()}
    except FileNotFoundError:
        raise RouterWeightsError(f"{path}: no such weights file") from None
    except Exception as exc:  # a corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None


class ReferenceNets:
    """A program's router networks and head rows, their files resolved against `base_dir`."""

    def __init__(self, base_dir: str | None = None):
        self.base_dir = base_dir
        self._tensors: dict[str, dict[str, np.ndarray]] = {}

    def path(self, file: str) -> str:
        return file if os.path.isabs(file) or self.base_dir is None else os.path.join(self.base_dir, file)

    def tensors(self, file: str) -> dict[str, np.ndarray]:
        if file not in self._tensors:
            self._tensors[file] = _load_safetensors(self.path(file))
        return self._tensors[file]

    def head_row(self, file: str) -> tuple[np.ndarray, float]:
        """A head row's weight [H] and bias (0 when the file has none)."""
        t = self.tensors(file)
        return t["weight"].reshape(-1), float(t["bias"].reshape(-1)[0]) if "bias" in t else 0.0

    def output(self, r: ir.RouterNet, cols: list[np.ndarray]) -> float:
        """The network's probability on one request's input columns (NaN when an input is
        not finite)."""
        x = np.concatenate(cols)
        if not np.isfinite(x).all():
            return math.nan
        t = self.tensors(r.file)
        if r.arch == "r2r":
            return sigmoid(_r2r_logit(t, r, cols))
        n = 0
        while f"layers.{n}.weight" in t:
            n += 1
        if n == 0:
            raise RouterWeightsError(f"{self.path(r.file)}: no tensor 'layers.0.weight'")
        for j in range(n):
            x = t[f"layers.{j}.weight"] @ x + t[f"layers.{j}.bias"]
            if j < n - 1:
                x = _activation(r.activation, x)
        if x.shape[0] == 1:
            return sigmoid(float(x[0]))
        z = x - x.max()
        p = np.exp(z) / np.exp(z).sum()
        return float(p[r.output_index])
