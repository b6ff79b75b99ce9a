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

import hashlib
import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from tokenrouter.compiler import ir

ARCHS = ("mlp", "citer", "r2r")
HEAD_ARCH = "co_llm"
META_ARCH = "tokenrouter.arch"
META_INPUTS = "tokenrouter.inputs"
META_THRESHOLD = "tokenrouter.threshold"
META_DIRECTION = "tokenrouter.direction"  # ">=" / "<" / ">": how the threshold is compared
META_MODELS = "tokenrouter.models"  # JSON {"reads": {name, fingerprint}, "large": {...}}
META_TRAINING = "tokenrouter.training"  # JSON: label scheme, data, figures
LN_EPS = 1e-5

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}
_LAYER_KEY = re.compile(r"layers\.(\d+)\.(weight|bias)")
_R2R_KEY = re.compile(r"inputs\.(\d+)\.(weight|bias)|proj\.(weight|bias)|blocks\.(\d+)\.(norm|up|down)\.(weight|bias)"
                      r"|norm\.(weight|bias)|out\.(weight|bias)")


class RouterWeightsError(ValueError):
    """A router weights file is missing, unreadable, or does not fit its declaration."""


# ------------------------------------------------------------------ input layout


def input_widths(router: ir.RouterNet) -> list[int]:
    """Width of each declared input (0 where the model's width is not known yet)."""
    out = []
    for inp in router.inputs:
        if isinstance(inp, (ir.InputHidden, ir.InputTokenEmbedding)):
            out.append(inp.dim)
        elif isinstance(inp, ir.InputTopkLogits):
            out.append(inp.k)
        else:
            out.append(1)
    return out


def input_width(router: ir.RouterNet) -> int:
    """Width of the router's input vector: the sum of its declared inputs' widths."""
    return sum(input_widths(router))


def _input_name(inp) -> str:
    if isinstance(inp, ir.InputHidden):
        return f"hidden({inp.layer})"
    if isinstance(inp, ir.InputTokenEmbedding):
        return "token_embedding"
    if isinstance(inp, ir.InputTopkLogits):
        return f"topk_logits({inp.k})"
    e = inp.expr
    if isinstance(e, ir.Entropy):
        return f"entropy({'normalized' if e.normalized else 'raw'})"
    return "top_prob" if isinstance(e, ir.TopProb) else "margin"


def layout_text(router: ir.RouterNet) -> str:
    """The input layout as the file's metadata records it: `hidden(-1):576,token_embedding:576,...`."""
    return ",".join(f"{_input_name(i)}:{w}" for i, w in zip(router.inputs, input_widths(router)))


def _layout_parts(text: str) -> list[tuple[str, int]]:
    parts = []
    for item in text.split(","):
        name, _, width = item.rpartition(":")
        parts.append((name, int(width) if width.isdigit() else 0))
    return parts


# ------------------------------------------------------------------ files


def resolve(path: str, base_dir: str | None) -> str:
    """A weights path as written in the program, relative to `base_dir` when not absolute."""
    return path if os.path.isabs(path) or not base_dir else os.path.join(base_dir, path)


def read_header(path: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """(metadata, {tensor: shape}) of a safetensors file, reading only its header."""
    if not os.path.isfile(path):
        raise RouterWeightsError(f"{path}: no such weights file")
    try:
        with safe_open(path, framework="pt") as f:
            meta = dict(f.metadata() or {})
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # a truncated, corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None
    return meta, shapes


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, with a clear error when that is impossible."""
    if not os.path.isfile(path):
        raise RouterWeightsError(f"{path}: no such weights file")
    try:
        return load_file(path)
    except Exception as exc:  # a truncated, corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None


def folder_fingerprint(folder: str) -> str:
    """A cheap fingerprint of a checkpoint folder: its config.json and, per safetensors
    file, the size, header and the first and last MiB of tensor data (16 hex digits).
    Two folders with the same fingerprint hold, in practice, the same model."""
    h = hashlib.sha256()
    cfg = os.path.join(folder, "config.json")
    if os.path.isfile(cfg):
        with open(cfg, "rb") as f:
            h.update(json.dumps(json.loads(f.read()), sort_keys=True).encode())
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")):
        path = os.path.join(folder, name)
        size = os.path.getsize(path)
        h.update(f"{name}:{size}".encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ checks


class _Problems:
    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes, self.out = shapes, []

    def need(self, name: str, expected: tuple[int | None, ...]) -> tuple[int, ...] | None:
        """The shape of `name` if present and of the expected rank; `None` entries match any size."""
        if name not in self.shapes:
            self.out.append(f"tensor '{name}' is missing")
            return None
        got = self.shapes[name]
        if len(got) != len(expected) or any(e is not None and e > 0 and e != g for e, g in zip(expected, got)):
            shown = [g if e is None or e <= 0 else e for e, g in zip(expected, got)] if len(got) == len(expected) \
                else [("?" if e is None else e) for e in expected]
            self.out.append(f"tensor '{name}' has shape {list(got)}, expected {shown}")
            return None
        return got


def _mlp_problems(router: ir.RouterNet, shapes) -> list[str]:
    p = _Problems(shapes)
    indices = set()
    for key in shapes:
        m = _LAYER_KEY.fullmatch(key)
        if not m:
            return [f"unexpected tensor '{key}' (a router network of arch {router.arch} holds only "
                    f"'layers.<i>.weight' and 'layers.<i>.bias')"]
        indices.add(int(m.group(1)))
    n = len(indices)
    if n == 0 or indices != set(range(n)):
        return [f"layers must be numbered 0..n-1, found {sorted(indices)}"]
    width = input_width(router) if all(w > 0 for w in input_widths(router)) else 0
    sizes = [width]
    for i in range(n):
        w_key, b_key = f"layers.{i}.weight", f"layers.{i}.bias"
        w = p.need(w_key, (None, sizes[-1]))
        if w is None:
            return p.out
        if p.need(b_key, (w[0],)) is None:
            return p.out
        sizes.append(w[0])
    if sizes[-1] > 1 and not 0 <= router.output_index < sizes[-1]:
        return [f"output_index {router.output_index} is out of range for {sizes[-1]} outputs"]
    if router.arch == "citer":
        h = shapes["layers.0.weight"][1]
        if n != 3 or sizes[1:] != [2 * h, h, 1]:
            return [f"a CITER classifier is h -> 2h -> h -> 1 (three layers, h = {h}: {[h, 2 * h, h, 1]}), "
                    f"the file holds {[h] + sizes[1:]}"]
    return p.out


def _r2r_problems(router: ir.RouterNet, shapes) -> list[str]:
    p = _Problems(shapes)
    n_in = len(router.inputs)
    blocks = set()
    for key in shapes:
        m = _R2R_KEY.fullmatch(key)
        if not m or (m.group(1) is not None and int(m.group(1)) >= n_in):
            return [f"unexpected tensor '{key}' (see router_nets.py for the r2r layout)"]
        if m.group(4) is not None:
            blocks.add(int(m.group(4)))
    if blocks and blocks != set(range(len(blocks))):
        return [f"blocks must be numbered 0..n-1, found {sorted(blocks)}"]
    widths = input_widths(router)
    projected = []
    for j, d in enumerate(widths):
        if f"inputs.{j}.weight" in shapes or f"inputs.{j}.bias" in shapes:
            w = p.need(f"inputs.{j}.weight", (None, d))
            if w is None or p.need(f"inputs.{j}.bias", (w[0],)) is None:
                return p.out
            projected.append(w[0])
        else:
            projected.append(d)
    total = sum(projected) if all(x > 0 for x in projected) else 0
    w = p.need("proj.weight", (None, total))
    if w is None or p.need("proj.bias", (w[0],)) is None:
        return p.out
    dim = w[0]
    for i in range(len(blocks)):
        for part in ("weight", "bias"):
            if p.need(f"blocks.{i}.norm.{part}", (dim,)) is None:
                return p.out
        up = p.need(f"blocks.{i}.up.weight", (None, dim))
        if up is None:
            return p.out
        for name, shape in ((f"blocks.{i}.up.bias", (up[0],)), (f"blocks.{i}.down.weight", (dim, up[0])),
                            (f"blocks.{i}.down.bias", (dim,))):
            if p.need(name, shape) is None:
                return p.out
    for name, shape in (("norm.weight", (dim,)), ("norm.bias", (dim,)), ("out.weight", (1, dim)), ("out.bias", (1,))):
        if p.need(name, shape) is None:
            return p.out
    return p.out


def file_problems(router: ir.RouterNet, meta: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """What is wrong with a router file for this declaration (empty: it fits). Widths the
    declaration does not know yet (0) are not compared."""
    arch = meta.get(META_ARCH)
    if arch is not None and arch != router.arch:
        return [f"the file holds a '{arch}' network, the declaration says arch = {router.arch}"]
    if arch is None and router.arch != "mlp":
        return [f"the file does not name its architecture (metadata '{META_ARCH}'); arch = {router.arch} needs it"]
    layout = meta.get(META_INPUTS)
    if layout is not None:
        theirs = _layout_parts(layout)
        ours = _layout_parts(layout_text(router))
        if [n for n, _ in theirs] != [n for n, _ in ours]:
            return [f"the network was fitted on inputs [{', '.join(n for n, _ in theirs)}], the declaration reads "
                    f"[{', '.join(n for n, _ in ours)}]"]
        for (name, a), (_, b) in zip(theirs, ours):
            if a and b and a != b:
                return [f"input {name} has width {b} here, the network was fitted on width {a}"]
    return _r2r_problems(router, shapes) if router.arch == "r2r" else _mlp_problems(router, shapes)


def head_problems(meta: dict[str, str], shapes: dict[str, tuple[int, ...]], hidden_size: int | None) -> list[str]:
    """What is wrong with a head-row file (empty: it fits)."""
    arch = meta.get(META_ARCH)
    if arch is not None and arch != HEAD_ARCH:
        return [f"the file holds a '{arch}' router network, not a head row ('{HEAD_ARCH}')"]
    extra = sorted(set(shapes) - {"weight", "bias"})
    if extra:
        return [f"unexpected tensor '{extra[0]}' (a head row holds 'weight' and 'bias')"]
    if "weight" not in shapes:
        return ["tensor 'weight' is missing"]
    w = shapes["weight"]
    h = hidden_size or (w[-1] if w else 0)
    if w not in ((h,), (1, h)):
        return [f"tensor 'weight' has shape {list(w)}, expected [{h}] or [1, {h}]"]
    if "bias" in shapes and shapes["bias"] != (1,):
        return [f"tensor 'bias' has shape {list(shapes['bias'])}, expected [1]"]
    return []


def fingerprints(meta: dict[str, str]) -> dict[str, dict[str, str]]:
    """{"reads": {"name", "fingerprint"}, "large": {...}} from a fitted file's metadata ({} if absent)."""
    try:
        data = json.loads(meta.get(META_MODELS, "{}"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------------ networks


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


def arch_metadata(router: ir.RouterNet) -> dict[str, str]:
    """The metadata that names a file's architecture and input layout."""
    return {META_ARCH: router.arch, META_INPUTS: layout_text(router)}
