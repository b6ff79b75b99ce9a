"""A decoder's layers as one C call per decode step (`csrc/decode_stack.c`): `DecodeStack`
holds the C struct of a model's per-layer tensors, the tensors it points to, and the work
and scratch buffers of its steps. The stack makes the calls of `bindings.py`'s kernels in C
(the integer products `int4x_mm`, `int4dp_mm` and `int8x_mm`, `rope_write`, `paged_attention`,
`add_rmsnorm`, `silu_mul`), so it shares their cache types (`KV_TYPES`), and returns the
first failing product's code (1: no memory, 2: not built for this CPU).
"""

from __future__ import annotations

import ctypes

import torch

from tokenrouter.runtime.kernels.bindings import KV_TYPES
from tokenrouter.runtime.kernels.build import NativeKernelError, load
from tokenrouter.runtime.kernels.int8x import Int8Avx2Weight
from tokenrouter.runtime.kernels.quant import Int4Avx2Weight, Int4DotWeight

MAT_I4X, MAT_DP, MAT_I8X, MAT_PARTS = 0, 1, 2, 3  # `tr_mat.kernel`: tr_i4x_mm (int4avx2, -x8),
# tr_int4dp_mm (int4dp, int4amx), tr_i8x_mm (int8avx2), a fused matrix's parts on their own kernels


class _Mat(ctypes.Structure):
    """`tr_mat` of csrc/decode_stack.c: one matrix and the kernel that runs it, or its parts."""


_Mat._fields_ = [("packed", ctypes.c_void_p), ("codes", ctypes.c_void_p), ("sm", ctypes.c_void_p),
                 ("kernel", ctypes.c_int32), ("xbits", ctypes.c_int32), ("amx", ctypes.c_int32),
                 ("nparts", ctypes.c_int32), ("n", ctypes.c_int64), ("parts", ctypes.POINTER(_Mat))]


def _mat(w, keep: list) -> _Mat:
    """The descriptor of a matrix as the per-call path holds it for its kernel (`PlannedLinear.impl`),
    or of a fused matrix's parts (a list of such, each part's `n` its output rows); arrays of
    parts go into `keep`, which must outlive the descriptor."""
    if isinstance(w, list):
        parts = (_Mat * len(w))(*[_mat(p, keep) for p in w])
        keep.append(parts)
        return _Mat(kernel=MAT_PARTS, nparts=len(w), parts=ctypes.cast(parts, ctypes.POINTER(_Mat)))
    if isinstance(w, Int4Avx2Weight):
        return _Mat(packed=w.packed.data_ptr(), kernel=MAT_I4X, xbits=w.xbits, n=w.n)
    if isinstance(w, Int8Avx2Weight):
        return _Mat(packed=w.packed.data_ptr(), kernel=MAT_I8X, xbits=w.xbits, n=w.n)
    if isinstance(w, Int4DotWeight):
        return _Mat(codes=w.codes.data_ptr(), sm=w.sm.data_ptr(), kernel=MAT_DP, amx=int(w.amx), n=w.n)
    raise TypeError(f"the stack runs the C integer kernels' matrices, not {type(w).__name__}")


class _Stack(ctypes.Structure):
    """`tr_stack` of csrc/decode_stack.c, field for field."""
    _pp = ctypes.POINTER(ctypes.c_void_p)
    _fields_ = [("layers", ctypes.c_int64), ("hidden", ctypes.c_int64), ("inter", ctypes.c_int64),
                ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("num_blocks", ctypes.c_int64),
                ("block_size", ctypes.c_int64), ("ln1", _pp), ("ln2", _pp), ("qk_norm", _pp), ("qkv_bias", _pp),
                ("o_bias", _pp), ("mats", ctypes.POINTER(_Mat)), ("kv", _pp), ("kv_type", ctypes.c_int64)]


class DecodeStack:
    """A decoder's layers as one C call per decode step (`csrc/decode_stack.c`): every matrix
    on a 4-bit C kernel, attention on the paged C kernel. Built once per model and cache from
    per-layer tensors (`layers`: dicts with ln1, ln2, qk_norm, qkv_bias, o_bias [float32 or
    None], qkv, o, gate_up, down [each the weight its kernel runs: `Int4Avx2Weight` for the
    integer int4 kernel, `Int8Avx2Weight` for the 8-bit one, `Int4DotWeight` for int4dp or
    int4amx; a list of those for a matrix fused from parts], kv [the layer's cache]); it keeps
    them alive, and its own work and scratch buffers, grown to the largest step seen. `run`
    computes layers l0..l1-1 in place on h."""

    def __init__(self, layers: list[dict], hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float, scale: float):
        lib = load()
        kv0 = layers[0]["kv"]
        if kv0.dtype not in KV_TYPES or any(not ly["kv"].is_contiguous() or ly["kv"].shape != kv0.shape
                                            or ly["kv"].dtype != kv0.dtype for ly in layers):
            raise ValueError("the stack takes contiguous float32/float16/bfloat16 cache layers of one shape")
        if kv0.shape[0] != 2 * kv_heads or kv0.shape[3] != head_dim or heads % kv_heads:
            raise ValueError("the cache layers do not match the model's heads")
        self._keep = layers  # the tensors whose addresses the C struct holds
        n = len(layers)

        def ptrs(key):
            arr = (ctypes.c_void_p * n)(*[None if ly[key] is None else ly[key].data_ptr() for ly in layers])
            self._arrays.append(arr)
            return ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p))

        self._arrays: list = []
        self._mats = (_Mat * (4 * n))(*[_mat(ly[key], self._arrays) for ly in layers
                                        for key in ("qkv", "o", "gate_up", "down")])
        s = _Stack(n, hidden, inter, heads, kv_heads, head_dim, eps, scale, kv0.shape[1], kv0.shape[2])
        for key in ("ln1", "ln2", "qk_norm", "qkv_bias", "o_bias", "kv"):
            setattr(s, key, ptrs(key))
        s.mats = ctypes.cast(self._mats, ctypes.POINTER(_Mat))
        s.kv_type = KV_TYPES[kv0.dtype]
        self._struct = s
        self._ref = ctypes.byref(s)
        self._widest = max(hidden, inter, heads * head_dim)
        self._lib = lib
        self._rows = 0
        self._work = self._scratch = None

    KEEP_ROWS = 64  # buffers for steps up to this many rows are kept; larger steps allocate their own

    def _buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(work, scratch) for a step of `rows` rows: kept from step to step up to `KEEP_ROWS`
        rows (a decode batch), so a rare large step does not hold its memory for good."""
        if rows <= self._rows:
            return self._work, self._scratch
        work = torch.empty(self._lib.tr_decode_stack_work_floats(self._ref, rows), dtype=torch.float32)
        scratch = torch.empty(self._lib.tr_i4x_scratch_bytes(rows, self._widest), dtype=torch.uint8)
        if rows <= self.KEEP_ROWS:
            self._rows, self._work, self._scratch = rows, work, scratch
        return work, scratch

    def run(self, h: torch.Tensor, l0: int, l1: int, cis: torch.Tensor, positions: torch.Tensor,
            slots: torch.Tensor, tables: torch.Tensor, rows: torch.Tensor, reqs: torch.Tensor,
            lens: torch.Tensor) -> None:
        """Layers l0..l1-1 over h [T, hidden] (float32, contiguous, updated in place) for a step
        whose every token's attention runs on the C kernel (rows, reqs, lens, tables as
        `paged_attention` takes them); cis [max_len, head_dim / 2, 2] float32, positions and
        slots [T] int64. The indices are the caller's to keep in range (`attention.build_meta`)."""
        t = h.shape[0]
        s = self._struct
        if h.dtype != torch.float32 or not h.is_contiguous() or h.shape[1] != s.hidden or rows.numel() != t:
            raise ValueError("h must be contiguous float32 [T, hidden] and every token's attention in the call")
        work, scratch = self._buffers(t)
        rc = self._lib.tr_decode_stack(self._ref, l0, l1, h.data_ptr(), t, cis.data_ptr(), positions.data_ptr(),
                                       slots.data_ptr(), tables.data_ptr(), tables.stride(0), rows.data_ptr(),
                                       reqs.data_ptr(), lens.data_ptr(), work.data_ptr(), scratch.data_ptr(),
                                       torch.get_num_threads())
        if rc == 1:
            raise MemoryError("a product of the decode stack could not allocate its scratch")
        if rc == 2:
            raise NativeKernelError("a product's C kernel in the decode stack is not built for this CPU")
        if rc:
            raise ValueError("a kernel of the decode stack refused its arguments")
