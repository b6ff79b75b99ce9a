"""A GGUF file's header in one pass: its metadata and where each tensor's bytes lie.

The `gguf` package's reader makes a memory-mapped slice for every value of the header: on
Qwen's files (151,936 tokens and as many merges) that took 20-40 s before any weight was
read. Here the header is parsed from one read-only map of the file with `struct`, in well
under a second, with the values the package gives (`str`, `int`, `float`, `bool`, and lists
of them). The format (version 2 and 3): magic, version, tensor count, metadata count, the
key/value pairs, the tensor infos (name, dims innermost first, ggml type, offset), then the
data, aligned to `general.alignment` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tokenrouter.runtime.loader.errors import LoadError

# value types: (struct code, numpy dtype) of the scalars; 8 string, 9 array
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16), 4: ("<I", np.uint32),
            5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_), 10: ("<Q", np.uint64),
            11: ("<q", np.int64), 12: ("<d", np.float64)}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # the ggml type's name: "Q4_K", "F32", ...
    type_id: int
    shape: tuple[int, ...]  # as GGUF gives it, innermost first: a matrix [N, K] is (K, N)
    offset: int  # of its first byte in the file
    nbytes: int


class _Cursor:
    def __init__(self, buf, pos: int = 0):
        self.buf, self.pos = buf, pos

    def scalar(self, code: str):
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return v

    def string(self) -> str:
        n = self.scalar("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            sub, n = self.scalar("<I"), self.scalar("<Q")
            if sub in _SCALARS and sub != 7:  # numbers: one frombuffer
                dt = np.dtype(_SCALARS[sub][1]).newbyteorder("<")
                a = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                return a.tolist()
            return [self.value(sub) for _ in range(n)]
        if vtype not in _SCALARS:
            raise LoadError(f"unknown GGUF value type {vtype}")
        return self.scalar(_SCALARS[vtype][0])


def read_header(path: str) -> tuple[dict[str, Any], list[TensorInfo]]:
    """(metadata, tensors) of a GGUF file; LoadError if it is not one."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise LoadError(f"{path}: not a readable GGUF file (empty)") from None
    try:
        return _parse(buf, path)
    except LoadError:
        raise
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise LoadError(f"{path}: not a readable GGUF file ({exc})") from None
    finally:
        buf.close()


def _parse(buf, path: str) -> tuple[dict[str, Any], list[TensorInfo]]:
    if bytes(buf[:4]) != b"GGUF":
        raise LoadError(f"{path}: not a readable GGUF file (no GGUF magic)")
    c = _Cursor(buf, 4)
    version = c.scalar("<I")
    if version not in (2, 3):
        raise LoadError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.scalar("<Q") for _ in range(c.scalar("<I")))
        type_id, offset = c.scalar("<I"), c.scalar("<Q")
        infos.append((name, dims, type_id, offset))
    align = int(meta.get("general.alignment", 32))
    start = -(-c.pos // align) * align
    tensors = []
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise LoadError(f"{path}: tensor {name!r} has an unknown ggml type {type_id}") from None
        per, size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(dims)) if dims else 1
        nbytes = count // per * size
        if start + offset + nbytes > len(buf):
            raise LoadError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        tensors.append(TensorInfo(name, qtype.name, type_id, dims, start + offset, nbytes))
    return meta, tensors
