"""C kernels compiled on the host that runs them, called through ctypes.

torch's CPU kernels leave a decode step's attention to several generic ops per layer (a
gather of the request's whole blocks, two batched products around a softmax, a permute),
and each costs its dispatch and a pass over the context. `csrc/paged_attention.c` does a
decode or short-extend token's attention in one pass that reads K/V where they lie in the
paged cache (`benchmarks/README.md`, "Engine", has the figures).

It is plain C, no torch headers: built at first use with the host's C compiler
(`cc -O3 -march=native -ffp-contract=fast -fopenmp`, `$CC` to choose another; without
OpenMP where the compiler lacks it) into the model cache (`ckernels/`),
keyed by the source, the compiler and the CPU, so a build is never carried to a host it
was not made for; built in about a second. Where no compiler works, `load` says why and
the engine keeps torch's path (`attention="auto"`), or refuses (`attention="native"`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

import torch

log = logging.getLogger(__name__)

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCES = tuple(os.path.join(_CSRC, n) for n in ("paged_attention.c",))
LIB_PREFIX = "tokenrouter-kernels-"
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c11", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)


class NativeKernelError(RuntimeError):
    """The C kernels could not be built or loaded on this host."""


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NativeKernelError("no C compiler found (install gcc, or set CC)")
    return cc


def _build(cc: str) -> str:
    """The library's path, built if missing: with OpenMP where the compiler has it (loaded
    after torch, it shares torch's libgomp, the same soname, so one thread pool serves both),
    else one thread."""
    try:
        return _build_with(cc, OPENMP)
    except NativeKernelError as first:
        try:
            return _build_with(cc, ())
        except NativeKernelError:
            raise first from None


def _build_with(cc: str, extra: tuple[str, ...]) -> str:
    from ..host import cpu_flags, cpu_model
    from ..loader.cache import cache_root
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeKernelError(f"C compiler {cc!r} does not run: {e}") from e
    src = b"".join(_read(p) for p in SOURCES)
    flags = (*FLAGS, *extra)
    key = hashlib.sha256(b"\0".join([src, cc.encode(), version.encode(), " ".join(flags).encode(),
                                     cpu_model().encode(), cpu_flags().encode()])).hexdigest()[:20]
    out_dir = os.path.join(cache_root(), "ckernels")
    lib = os.path.join(out_dir, f"{LIB_PREFIX}{key}.so")
    if os.path.isfile(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, *SOURCES, "-o", tmp, "-lm"], capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise NativeKernelError(f"{cc} failed to build the C kernels: {r.stderr.strip()[-2000:]}")
        os.replace(tmp, lib)  # atomic: concurrent subservers never load half a library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in os.listdir(out_dir):  # builds of older sources or other flags (a loaded one stays mapped)
        if old.endswith(".so") and old != os.path.basename(lib):
            try:
                os.unlink(os.path.join(out_dir, old))
            except OSError:
                pass
    return lib


_lib = None
_error: str | None = None


def load():
    """The loaded library (built first if needed); raises NativeKernelError, once per process
    with the same message afterwards."""
    global _lib, _error
    if _lib is not None:
        return _lib
    if _error is not None:
        raise NativeKernelError(_error)
    try:
        lib = ctypes.CDLL(_build(_compiler()))
    except (NativeKernelError, OSError) as e:
        _error = str(e)
        raise NativeKernelError(_error) from e
    i64 = ctypes.c_int64
    fn = lib.tr_paged_attention_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, i64, ctypes.c_void_p, i64, i64, i64, i64, i64, ctypes.c_void_p, i64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, i64, ctypes.c_float, ctypes.c_void_p, i64, i64]
    _lib = lib
    return lib


def available() -> str | None:
    """None if the kernels load here, else why not."""
    try:
        load()
        return None
    except NativeKernelError as e:
        return str(e)


def paged_attention(q: torch.Tensor, kv_layer: torch.Tensor, tables: torch.Tensor, rows: torch.Tensor,
                    reqs: torch.Tensor, lens: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """Attention of the tokens `rows` (indices into q's and out's first dim) over their
    requests' first `lens` keys, written into `out` [T, heads * head_dim].

    q [T, heads, head_dim] float32 (rows may be strided, each row's heads contiguous);
    kv_layer [2 * kv_heads, num_blocks, block_size, head_dim] contiguous float32; tables
    [b, nb] int64 block tables; rows, reqs (index into tables), lens: [n] int64. The
    indices are the caller's to keep in range (`attention.build_meta` checks them once per
    step): the kernel reads where they point."""
    lib = load()
    kvh2, num_blocks, block_size, hd = kv_layer.shape
    t, nh, qhd = q.shape
    if q.dtype != torch.float32 or kv_layer.dtype != torch.float32 or out.dtype != torch.float32:
        raise TypeError("the C attention kernel takes float32 q, cache and output")
    if q.device.type != "cpu" or kv_layer.device.type != "cpu":
        raise TypeError("the C attention kernel runs on CPU tensors")
    if qhd != hd or q.stride(2) != 1 or q.stride(1) != hd or not kv_layer.is_contiguous():
        raise ValueError("q rows must hold [heads, head_dim] contiguously and the cache layer must be contiguous")
    if out.shape != (t, nh * hd) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {nh * hd}] with contiguous rows")
    kvh = kvh2 // 2
    if nh % kvh:
        raise ValueError(f"{nh} query heads do not divide into {kvh} KV heads")
    for name, a in (("tables", tables), ("rows", rows), ("reqs", reqs), ("lens", lens)):
        if a.dtype != torch.int64 or not a.is_contiguous():
            raise TypeError(f"{name} must be contiguous int64")
    n = rows.numel()
    if not (reqs.numel() == lens.numel() == n):
        raise ValueError("rows, reqs and lens must have one entry per token")
    rc = lib.tr_paged_attention_f32(q.data_ptr(), q.stride(0), kv_layer.data_ptr(), num_blocks, block_size,
                                    kvh, nh // kvh, hd, tables.data_ptr(), tables.stride(0), rows.data_ptr(),
                                    reqs.data_ptr(), lens.data_ptr(), n, float(scale), out.data_ptr(),
                                    out.stride(0), torch.get_num_threads())
    if rc:
        raise MemoryError("the C attention kernel could not allocate its scores")


def source_hash() -> str:
    """A short hash of the kernels' sources (a measured choice is kept per source)."""
    return hashlib.sha256(b"".join(_read(p) for p in SOURCES)).hexdigest()[:12]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
