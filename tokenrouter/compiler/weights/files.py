"""Router weight files without torch: their header, layout, fingerprints, and the checks
of a file against its declaration (`tokenrouter check` reads these, and must not pay for
importing torch: 2.3 s of its 3.8 s here). The networks themselves are `nets.py`,
whose docstring describes each architecture's tensor layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from safetensors import safe_open

from tokenrouter.compiler import ir
from tokenrouter.compiler.features import feature_of
from tokenrouter.compiler.text import input_text

HEAD_ARCH = "co_llm"
META_ARCH = "tokenrouter.arch"
META_INPUTS = "tokenrouter.inputs"
META_THRESHOLD = "tokenrouter.threshold"
META_DIRECTION = "tokenrouter.direction"  # ">=" / "<" / ">": how the threshold is compared
META_MODELS = "tokenrouter.models"  # JSON {"reads": {name, fingerprint}, "large": {...}}
META_TRAINING = "tokenrouter.training"  # JSON: label scheme, data, figures
LN_EPS = 1e-5
_LAYER_KEY = re.compile(r"layers\.(\d+)\.(weight|bias)")
_R2R_KEY = re.compile(r"inputs\.(\d+)\.(weight|bias)|proj\.(weight|bias)|blocks\.(\d+)\.(norm|up|down)\.(weight|bias)"
                      r"|norm\.(weight|bias)|out\.(weight|bias)")


class RouterWeightsError(ValueError):
    """A router weights file is missing, unreadable, or does not fit its declaration."""


# ------------------------------------------------------------------ input layout


def input_widths(router: ir.RouterNet) -> list[int]:
    """Width of each declared input (0 where the model's width is not known yet)."""
    return [1 if isinstance(inp, ir.InputScalar) else getattr(inp, feature_of(inp).value.width)
            for inp in router.inputs]


def input_width(router: ir.RouterNet) -> int:
    """Width of the router's input vector: the sum of its declared inputs' widths."""
    return sum(input_widths(router))


def layout_text(router: ir.RouterNet) -> str:
    """The input layout as the file's metadata records it: `hidden(-1):576,token_embedding:576,...`."""
    return ",".join(f"{input_text(i)}:{w}" for i, w in zip(router.inputs, input_widths(router)))


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


def file_problem(path: str) -> str | None:
    """Why `path` cannot be a weights file (missing, a folder, a device, a pipe, unreadable), or None."""
    if not os.path.exists(path):
        return "no such weights file"
    if os.path.isdir(path):
        return "is a folder, not a weights file"
    if not os.path.isfile(path):
        return "is not a regular file (a device, a pipe or a socket), not a weights file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def read_header(path: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """(metadata, {tensor: shape}) of a safetensors file, reading only its header."""
    why = file_problem(path)
    if why is not None:
        raise RouterWeightsError(f"{path}: {why}")
    try:
        with safe_open(path, framework="numpy") as f:
            meta = dict(f.metadata() or {})
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # a truncated, corrupt or non-safetensors file
        raise RouterWeightsError(f"{path}: not a readable safetensors file ({exc})") from None
    return meta, shapes


DERIVED_IDENTITY = "derived.json"  # in a derived model's folder: what it was made from, and how


def folder_fingerprint(folder: str) -> str:
    """A cheap fingerprint of a checkpoint folder: its config.json and, per safetensors
    file, the size, header and the first and last MiB of tensor data (16 hex digits).
    Two folders with the same fingerprint hold, in practice, the same model.

    A derived model (`DERIVED_IDENTITY` present, `runtime.loader.derive`) is identified by
    that file instead, its source model's fingerprint and its recipe: its bytes depend on the
    host that derived it (its lens is fitted on hidden states computed with the host's float
    kernels; two hosts' builds differ in low bits), while a router fitted on one host's build
    fits the other's just as well."""
    ident = os.path.join(folder, DERIVED_IDENTITY)
    if os.path.isfile(ident):
        with open(ident, "rb") as f:
            return hashlib.sha256(json.dumps(json.loads(f.read()), sort_keys=True).encode()).hexdigest()[:16]
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
            return [f"unexpected tensor '{key}' (see compiler/weights/nets.py for the r2r layout)"]
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


def arch_metadata(router: ir.RouterNet) -> dict[str, str]:
    """The metadata that names a file's architecture and input layout."""
    return {META_ARCH: router.arch, META_INPUTS: layout_text(router)}
