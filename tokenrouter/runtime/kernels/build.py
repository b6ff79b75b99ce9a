"""The C kernels' library: built on the host that runs it with the host's C compiler, loaded
through ctypes.

The sources are plain C, no torch headers (`csrc/`; what each kernel does is in
`bindings.py`, which wraps them). The library is built at first use
(`cc -O3 -march=native -ffp-contract=fast -fopenmp`, `$CC` to choose another; without
OpenMP where the compiler lacks it) into the cache (`ckernels/` under `cache.cache_root`),
keyed by the sources, the compiler, its flags and the CPU, so a build is never carried to a
host it was not made for; built in about a second. Where no compiler works, `load` says why
(`NativeKernelError`, once per process) and the engine keeps torch's path
(`attention="auto"`) or refuses (`attention="native"`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

# loaded before the library, so that the library's OpenMP runtime is torch's libgomp (the same
# soname): one thread pool serves both
import torch  # noqa: F401

from tokenrouter.runtime.cache import cache_root
from tokenrouter.runtime.host import cpu_flags, cpu_model

log = logging.getLogger(__name__)

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCES = tuple(os.path.join(_CSRC, n) for n in ("paged_attention.c", "decode_ops.c", "int4_matmul.c"))
HEADERS = tuple(os.path.join(_CSRC, n) for n in ("vexp.h",))
LIB_PREFIX = "tokenrouter-kernels-"
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c11", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)

_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
# the library's functions: name -> (return type, argument types), as `csrc/` declares them
SIGNATURES = {
    "tr_paged_attention_f32": (ctypes.c_int, [_p, _i64, _p, _i64, _i64, _i64, _i64, _i64, _p, _i64, _p, _p, _p,
                                              _i64, _f32, _p, _i64, _i64]),
    "tr_add_rmsnorm": (None, [_p, _i64, _p, _i32, _i64, _p, _f32, _p, _i32, _i64, _i64, _i64, _i64]),
    "tr_silu_mul": (None, [_p, _i32, _i64, _p, _i32, _i64, _i64, _i64, _i64]),
    "tr_rope_write": (None, [_p, _i32, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _f32, _p, _i64, _p, _p, _i64,
                             _i64]),
    "tr_int4dp_supported": (ctypes.c_int, []),
    "tr_int4dp_mm": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _p, _p, _i64, _p, _i64, _i32, _i32]),
    "tr_int4amx_supported": (ctypes.c_int, []),
}


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
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeKernelError(f"C compiler {cc!r} does not run: {e}") from e
    src = b"".join(_read(p) for p in (*SOURCES, *HEADERS))
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
    log.info("building the C kernels with %s (once per host)", os.path.basename(cc))
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
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _lib = lib
    return lib


def available() -> str | None:
    """None if the kernels load here, else why not."""
    try:
        load()
        return None
    except NativeKernelError as e:
        return str(e)


def source_hash() -> str:
    """A short hash of the kernels' sources (a measured choice is kept per source)."""
    return hashlib.sha256(b"".join(_read(p) for p in (*SOURCES, *HEADERS))).hexdigest()[:12]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
