"""A matrix as a GGUF file stores it: rows of ggml blocks, read in place (`BlockRows`).

`quant = native` keeps a file's embedding and LM head this way, usually a read-only memory
map of the file's bytes: the embedding lookup dequantises the rows of the tokens it embeds
and the head's rescoring the rows of its best candidates (`csrc/gguf_rows.c`, the `gguf`
package's values bit for bit), so no float copy of either is ever made, and the pages of the
file nobody reads stay on disk (where the C kernels cannot be built, the `gguf` package's
numpy dequantisation reads them, to the same values). The decoder's matrices are decoded once
into integer codes with per-group scales (`codes`: a `quant.QuantTensor`) that the integer
kernels pack:

| type | block | QuantTensor | w |
| --- | --- | --- | --- |
| Q4_0 | 32 weights, 18 B | q4, group 32 | (q - 8) d |
| Q4_1 | 32, 20 B | q4, group 32 | (q - 8) d + (m + 8 d) |
| Q4_K | 256, 144 B | q4, group 32 | (q - 8) (d sc) + (8 d sc - dmin m) |
| Q5_0 | 32, 22 B | q8, group 32 | (q - 16) d |
| Q8_0 | 32, 34 B | q8, group 32 | q d |
| Q6_K | 256, 210 B | q8, group 16 | (q - 32) (d sc), sc int8 per 16 |

Every one of these is exact: the codes are the file's, the scales float32 (d sc of Q4_K and
Q6_K multiply an 11-bit float16 by a 6- or 8-bit integer: exact in float32), and q8's w = c s
is then the file's value bit for bit. Q4_K's zero = 8 d sc - dmin m may round once in
float32. Other types (Q5_1, Q5_K, float) have no integer kernel here and are held as
`dequantize()` gives them (docs/models.md says which).
"""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tokenrouter.runtime.kernels.build import available, load
from tokenrouter.runtime.kernels.quant import QuantTensor

# ggml's type ids, and per type (weights per block, bytes per block): the types gguf_rows.c reads
GGML_TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
              "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
              "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}
CODED = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K")  # the types `codes` decodes for an integer kernel


def row_bytes(kind: str, k: int) -> int:
    """Bytes of one row of k weights of ggml type `kind`."""
    _, per, size = GGML_TYPES[kind]
    if k % per:
        raise ValueError(f"{kind} rows hold multiples of {per} weights, not {k}")
    return k // per * size


class BlockRows:
    """A matrix [N, K] of ggml type `kind` as its raw blocks: `data` uint8 [N, row bytes]
    (read only: often a memory map of the file, `from_file`). `dequantize(rows)` reads rows of
    it in C."""

    __slots__ = ("kind", "data", "shape", "_map")

    @classmethod
    def from_file(cls, path: str, offset: int, kind: str, shape: tuple[int, int]) -> "BlockRows":
        """The matrix at byte `offset` of the file, mapped read-only (its own mapping: only the
        pages read count in the process's memory, and `release` gives them back)."""
        n, k = shape
        size = n * row_bytes(kind, k)
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), size + offset - start, offset=start, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():  # read-only on purpose: nothing writes the file's blocks
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(mapped, dtype=torch.uint8, offset=offset - start, count=size)
        rows = cls(kind, data.view(n, -1), shape)
        rows._map = mapped
        return rows

    def release(self) -> None:
        """Give back the pages of a file-mapped matrix read so far (they are read again from the
        file if needed): after its codes were decoded for a kernel, nothing reads them."""
        if self._map is not None and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def __init__(self, kind: str, data: torch.Tensor, shape: tuple[int, int]):
        if kind not in GGML_TYPES:
            raise ValueError(f"ggml type {kind} is not one the row reader takes ({', '.join(GGML_TYPES)})")
        n, k = shape
        if data.dtype != torch.uint8 or tuple(data.shape) != (n, row_bytes(kind, k)) or data.stride(1) != 1:
            raise ValueError(f"{kind} blocks of a [{n}, {k}] matrix are uint8 [{n}, {row_bytes(kind, k)}] with "
                             f"contiguous rows, not {data.dtype} {tuple(data.shape)}")
        self.kind, self.data, self.shape = kind, data, torch.Size(shape)
        self._map = None

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        return self.data.shape[0] * self.data.shape[1]

    @property
    def source(self) -> str:
        return self.kind

    def dequantize(self, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float values of `rows` (int64 indices, any shape: the result has that shape plus
        K), or of the whole matrix."""
        ids = torch.arange(self.shape[0]) if rows is None else rows.reshape(-1).to(torch.int64).contiguous()
        k = self.shape[1]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.shape[0]):
            raise IndexError(f"row index out of range for a matrix of {self.shape[0]} rows")
        if available() is not None:  # no C kernels here: the gguf package's numpy, the same values
            rows_np = self.data.numpy()[ids.numpy()]
            out = torch.from_numpy(gguf_dequantize(rows_np, GGMLQuantizationType[self.kind]).reshape(-1, k).copy())
        else:
            out = torch.empty(ids.numel(), k, dtype=torch.float32)
            rc = load().tr_gguf_rows(GGML_TYPES[self.kind][0], self.data.data_ptr(), self.data.stride(0),
                                     ids.data_ptr(), ids.numel(), k, out.data_ptr(), k, torch.get_num_threads())
            if rc:
                raise ValueError(f"the row reader refused {self.kind} rows of {k} weights")
        shape = (*((self.shape[0],) if rows is None else tuple(rows.shape)), k)
        return out.view(shape).to(dtype)

    def map_rows(self, fn) -> "BlockRows":
        """The same matrix with its rows reordered by `fn` (rows are whole blocks: moved as they are)."""
        return BlockRows(self.kind, fn(self.data).contiguous(), tuple(self.shape))  # a copy in memory

    def codes(self) -> QuantTensor | None:
        """The integer codes and per-group scales (module docstring), or None for a type no
        integer kernel takes."""
        if self.kind not in CODED:
            return None
        n, k = self.shape
        b = self.data.numpy().reshape(n * k // GGML_TYPES[self.kind][1], -1)
        return _DECODERS[self.kind](b, n, k)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 [blocks]."""
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-weight layout: byte j holds weight j (low nibble) and j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0_1(b: np.ndarray, n: int, k: int, kind: str) -> QuantTensor:
    d = _f16(b, 0)
    codes = _nibbles(b[:, 4:20] if kind == "Q4_1" else b[:, 2:18])
    zero = torch.from_numpy((_f16(b, 2) + 8.0 * d).reshape(n, k // 32)) if kind == "Q4_1" else None
    return QuantTensor("q4", _t(codes, n, k), _t(d, n, k // 32), zero, 32, kind)


def _q4_k(b: np.ndarray, n: int, k: int) -> QuantTensor:
    """Q4_K as group-32 int4: 8 sub-blocks of 32 with 6-bit sc_j and m_j; sub-blocks 2i and
    2i+1 share 32 bytes of codes (low and high nibbles). w = d sc_j q - dmin m_j, the int4
    kernel's (q - 8) scale + zero with scale = d sc_j, zero = 8 scale - dmin m_j."""
    d, dmin = _f16(b, 0)[:, None], _f16(b, 2)[:, None]
    sc, mins = _scales_k4(b[:, 4:16])
    scale = d * sc.astype(np.float32)
    zero = 8.0 * scale - dmin * mins.astype(np.float32)
    qs = b[:, 16:].reshape(-1, 4, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    return QuantTensor("q4", _t(codes, n, k), _t(scale, n, k // 32), _t(zero, n, k // 32), 32, "Q4_K")


def _scales_k4(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 6-bit scales and mins of its 8 sub-blocks from their 12 bytes: j < 4 in the low
    6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 and the top 2 bits of
    bytes j - 4 and j."""
    lo, mid, hi = q[:, 0:4], q[:, 4:8], q[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, mins


def _q5_0(b: np.ndarray, n: int, k: int) -> QuantTensor:
    qh = np.ascontiguousarray(b[:, 2:6]).view(np.uint32)  # [blocks, 1]: bit j is weight j's fifth
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    codes = (_nibbles(b[:, 6:22]) | (high << 4)).astype(np.int8) - np.int8(16)
    return QuantTensor("q8", _t(codes, n, k), _t(_f16(b, 0), n, k // 32), None, 32, "Q5_0")


def _q8_0(b: np.ndarray, n: int, k: int) -> QuantTensor:
    codes = np.ascontiguousarray(b[:, 2:]).view(np.int8)
    return QuantTensor("q8", _t(codes, n, k), _t(_f16(b, 0), n, k // 32), None, 32, "Q8_0")


def _q6_k(b: np.ndarray, n: int, k: int) -> QuantTensor:
    """Q6_K: per 128 weights, 64 bytes of low nibbles (weights 0-63 low, 64-127 high) and 32 of
    two-bit pairs (weights 32 s + l in bits 2 s of byte l); int8 sc per 16; float16 d last."""
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 2, 4, 32)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    codes = (ql | ((qh & 3) << 4)).astype(np.int8) - np.int8(32)
    scale = _f16(b, 208)[:, None] * np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    return QuantTensor("q8", _t(codes, n, k), _t(scale, n, k // 16), None, 16, "Q6_K")


def _t(a: np.ndarray, n: int, cols: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).reshape(n, cols))


_DECODERS = {"Q4_0": lambda b, n, k: _q4_0_1(b, n, k, "Q4_0"), "Q4_1": lambda b, n, k: _q4_0_1(b, n, k, "Q4_1"),
             "Q4_K": _q4_k, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q6_K": _q6_k}
