"""The fit's files: each written under a temporary name next to its destination and
renamed into place only when all of them are complete (`publish`), so a fit that fails
writes none of them; the probe, the weights as they stand, which the fit reads back as
serving does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile

import torch
from safetensors.torch import save_file

from tokenrouter.compiler.weights import nets as rn
from tokenrouter.fit.job import FitOptions
from tokenrouter.fit.report import plot
from tokenrouter.fit.target import Target


def atomic(path: str, write) -> str:
    """Write via `write(tmp_path)` into the target folder; returns the temporary path."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fit-", suffix=os.path.basename(path), dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the outputs private
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_weights(path: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """The weights in a temporary file next to `path`; returns its path."""
    return atomic(path, functools.partial(save_file, tensors, metadata=meta))


class Probe:
    """The weights as they stand, under a temporary name next to --out, so that the
    inference module reads them from a file as serving does."""

    def __init__(self, out: str):
        self.out = out
        self.path: str | None = None

    def write(self, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
        if self.path is not None:
            os.unlink(self.path)
        self.path = write_weights(self.out, tensors, meta)

    def remove(self) -> None:
        os.unlink(self.path)


def metadata(target: Target, fingerprints: dict) -> dict[str, str]:
    """The weights file's metadata before the threshold is chosen."""
    meta = {rn.META_ARCH: target.arch, rn.META_DIRECTION: target.op}
    if target.router is not None:
        meta[rn.META_INPUTS] = rn.layout_text(target.router)
    meta[rn.META_MODELS] = json.dumps(fingerprints, sort_keys=True)
    return meta


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def publish(opts: FitOptions, weights_tmp: str, report: dict) -> tuple[str, str]:
    """Write the report's JSON and figure next to the weights' temporary file, then rename
    all three into place; returns the report's paths."""
    stem = opts.report or opts.out[: -len(".safetensors")] + ".report"
    json_tmp = atomic(stem + ".json", functools.partial(_write_text, json.dumps(report, indent=1) + "\n"))
    png_tmp = atomic(stem + ".png", functools.partial(plot, report))
    for tmp, dst in ((weights_tmp, opts.out), (json_tmp, stem + ".json"), (png_tmp, stem + ".png")):
        os.replace(tmp, dst)
    return stem + ".json", stem + ".png"


def _write_text(text: str, path: str) -> None:
    with open(path, "w") as f:
        f.write(text)
