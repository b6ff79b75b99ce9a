"""The C kernels' library: built on the host that runs it with the host's C compiler, loaded
through ctypes.

The sources are plain C, no torch headers (`csrc/`; what each kernel does is in
`bindings.py`, which wraps them). The library is built at first use
(`cc -O3 -march=native -ffp-contract=fast -fopenmp`, `$CC` to choose another; without
OpenMP where the compiler lacks it) into the cache (`ckernels/` under `cache.cache_root`),
keyed by the sources, the compiler, its flags and the CPU, so a build is never carried to a
host it was not made for; built in a few seconds. Where no compiler works, `load` says why
(`NativeKernelError`, once per process) and the engine keeps torch's path
(`attention="auto"`) or refuses (`attention="native"`).

`variant(defines)` builds and loads the same sources with extra `-D` macros beside it (the
tests run the AVX-VNNI and AVX-512 VNNI code paths of `csrc/int4_avx2.c` emulated on AVX2
hosts this way); `assembly(source, march)` compiles one source for another CPU, so the tests
can check which instructions a path this host cannot run would use.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
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
SOURCES = tuple(os.path.join(_CSRC, n) for n in ("paged_attention.c", "decode_ops.c", "int4_matmul.c",
                                                  "int4_avx2.c", "decode_stack.c", "head_rescore.c",
                                                  "gguf_rows.c", "int8_avx2.c"))
HEADERS = tuple(os.path.join(_CSRC, n) for n in ("vexp.h", "kernels.h", "xquant.h"))
LIB_PREFIX = "tokenrouter-kernels-"
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c11", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)

_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
# the library's functions: name -> (return type, argument types), as `csrc/` declares them
SIGNATURES = {
    "tr_paged_attention": (ctypes.c_int, [_p, _i64, _p, _i32, _i64, _i64, _i64, _i64, _i64, _p, _i64, _p, _p, _p,
                                          _i64, _f32, _p, _i64, _i64]),
    "tr_add_rmsnorm": (None, [_p, _i64, _p, _i32, _i64, _p, _f32, _p, _i32, _i64, _i64, _i64, _i64]),
    "tr_silu_mul": (None, [_p, _i32, _i64, _p, _i32, _i64, _i64, _i64, _i64]),
    "tr_rope_write": (None, [_p, _i32, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _f32, _p, _i32, _i64, _p, _p,
                             _i64, _i64]),
    "tr_int4dp_supported": (ctypes.c_int, []),
    "tr_int4dp_mm": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _p, _p, _i64, _p, _i64, _i32, _i32]),
    "tr_int4amx_supported": (ctypes.c_int, []),
    "tr_i4x_isa": (ctypes.c_int, []),
    "tr_i4x_packed_bytes": (_i64, [_i64, _i64]),
    "tr_i4x_scratch_bytes": (_i64, [_i64, _i64]),
    "tr_i4x_pack": (ctypes.c_int, [_p, _p, _p, _i64, _i64, _p]),
    "tr_i4x_quantize": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _i32, _p]),
    "tr_i4x_mm": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _i32, _p, _i64, _p, _i64, _p, _i32]),
    "tr_i4x_mm_multi": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _i32, _i32, _p, _p, _p, _p, _p, _i32]),
    "tr_i4x_mm_q": (ctypes.c_int, [_p, _i64, _i64, _i32, _i32, _p, _p, _p, _p, _i32]),
    "tr_decode_stack_work_floats": (_i64, [_p, _i64]),
    "tr_rescore_top": (ctypes.c_int, [_p, _i64, _i64, _i64, _p, _i64, _i64, _i32, _p, _i64, _p, _i64, _i64, _i64]),
    "tr_i8x_packed_bytes": (_i64, [_i64, _i64, _i64, _i64]),
    "tr_i8x_scratch_bytes": (_i64, [_i64, _i64]),
    "tr_i8x_pack": (ctypes.c_int, [_p, _p, _i64, _i64, _i64, _i64, _p]),
    "tr_i8x_mm": (ctypes.c_int, [_p, _i32, _i64, _i64, _i64, _i32, _p, _i64, _p, _i64, _p, _i32]),
    "tr_gguf_supported": (ctypes.c_int, [_i32]),
    "tr_gguf_rows": (ctypes.c_int, [_i32, _p, _i64, _p, _i64, _i64, _p, _i64, _i32]),
    "tr_decode_stack": (ctypes.c_int, [_p, _i64, _i64, _p, _i64, _p, _p, _p, _p, _i64, _p, _p, _p, _p, _p, _i32]),
}


class NativeKernelError(RuntimeError):
    """The C kernels could not be built or loaded on this host."""


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NativeKernelError("no C compiler found (install gcc, or set CC)")
    return cc


def _build(cc: str, defines: tuple[str, ...] = ()) -> str:
    """The library's path, built if missing: with OpenMP where the compiler has it (loaded
    after torch, it shares torch's libgomp, the same soname, so one thread pool serves both),
    else one thread."""
    macros = tuple(f"-D{d}" for d in defines)
    try:
        return _build_with(cc, (*macros, *OPENMP), "".join(f"{d}-" for d in defines))
    except NativeKernelError as first:
        try:
            return _build_with(cc, macros, "".join(f"{d}-" for d in defines))
        except NativeKernelError:
            raise first from None


def _build_with(cc: str, extra: tuple[str, ...], tag: str = "") -> str:
    """Build into the cache as `LIB_PREFIX + tag + key`.so; older builds of the same tag go."""
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeKernelError(f"C compiler {cc!r} does not run: {e}") from e
    src = b"".join(_read(p) for p in (*SOURCES, *HEADERS))
    flags = (*FLAGS, *extra)
    key = hashlib.sha256(b"\0".join([src, cc.encode(), version.encode(), " ".join(flags).encode(),
                                     cpu_model().encode(), cpu_flags().encode()])).hexdigest()[:20]
    out_dir = os.path.join(cache_root(), "ckernels")
    lib = os.path.join(out_dir, f"{LIB_PREFIX}{tag}{key}.so")
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
    stale = re.compile(re.escape(LIB_PREFIX + tag) + r"[0-9a-f]{20}\.so")
    for old in os.listdir(out_dir):  # builds of older sources or other flags (a loaded one stays mapped)
        if stale.fullmatch(old) and old != os.path.basename(lib):
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
        lib = _open(_build(_compiler()))
    except (NativeKernelError, OSError) as e:
        _error = str(e)
        raise NativeKernelError(_error) from e
    _lib = lib
    return lib


def _open(path: str):
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


_variants: dict[tuple[str, ...], object] = {}


def variant(defines: tuple[str, ...]):
    """The library built with the extra macros `defines` (e.g. ("TR_I4X_EMULATE_VNNI",)), kept
    beside the main one under its own name; raises NativeKernelError where it cannot build."""
    if defines not in _variants:
        try:
            _variants[defines] = _open(_build(_compiler(), defines))
        except OSError as e:
            raise NativeKernelError(str(e)) from e
    return _variants[defines]


def assembly(source: str, march: str) -> str:
    """The assembly `cc -O3 -march=<march>` makes of `csrc/<source>` (never run here: it tells
    which instructions a path for another CPU holds). NativeKernelError if it does not compile."""
    cc = _compiler()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.s")
        r = subprocess.run([cc, *[f for f in FLAGS if f not in ("-march=native", "-shared", "-fPIC")], *OPENMP,
                            f"-march={march}", "-S", os.path.join(_CSRC, source), "-o", out],
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise NativeKernelError(f"{cc} -march={march} failed on {source}: {r.stderr.strip()[-2000:]}")
        with open(out) as f:
            return f.read()


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
