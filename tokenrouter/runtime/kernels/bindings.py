"""The C kernels as Python functions on torch tensors (the library: `build.py`).

torch's CPU kernels leave a decode step's attention to several generic ops per layer (a
gather of the request's whole blocks, two batched products around a softmax, a permute),
and each costs its dispatch and a pass over the context. `paged_attention`
(`csrc/paged_attention.c`) does a decode or short-extend token's attention in one pass that
reads K/V where they lie in the paged cache (`benchmarks/README.md`, "Engine", has the
figures). `add_rmsnorm`, `silu_mul` and `rope_write` (`csrc/decode_ops.c`) do the
element-wise stretches between a quantised layer's matrix products (residual add, RMSNorm,
casts, RoPE, the K/V write, SwiGLU) in one pass each, where torch runs about 25 ops a layer.
`int4dp_mm` (`csrc/int4_matmul.c`) multiplies by 4-bit weights on AVX-512 bfloat16 dot
products or AMX tiles, unpacking each block of codes once for up to 8 rows (a kernel
candidate of `linear.PlannedLinear`). A decoder's layers as one C call of these kernels are
`decode_stack.DecodeStack`.

Each wrapper checks what would make the C code read or write out of bounds (dtypes,
shapes, strides); the indices it is given (block tables, slots) are the caller's to keep in
range.
"""

from __future__ import annotations

import torch

from tokenrouter.runtime.kernels.build import NativeKernelError, available, load

# the KV cache's element types the C kernels read and write, and their codes
KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def paged_attention(q: torch.Tensor, kv_layer: torch.Tensor, tables: torch.Tensor, rows: torch.Tensor,
                    reqs: torch.Tensor, lens: torch.Tensor, scale: float, out: torch.Tensor,
                    check: bool = True) -> None:
    """Attention of the tokens `rows` (indices into q's and out's first dim) over their
    requests' first `lens` keys, written into `out` [T, heads * head_dim].

    q [T, heads, head_dim] float32 (rows may be strided, each row's heads contiguous);
    kv_layer [2 * kv_heads, num_blocks, block_size, head_dim] contiguous float32, float16 or
    bfloat16 (`KV_TYPES`; read widened to float32, exactly); tables
    [b, nb] int64 block tables; rows, reqs (index into tables), lens: [n] int64. The
    indices are the caller's to keep in range (`attention.build_meta` checks them once per
    step): the kernel reads where they point. `check=False` skips the dtype and layout checks
    for a caller that made them on an earlier layer of the same forward (the shapes repeat)."""
    lib = load()
    kvh2, num_blocks, block_size, hd = kv_layer.shape
    nh, kvh = q.shape[1], kvh2 // 2
    n = rows.numel()
    if check:
        _check_attention(q, kv_layer, tables, rows, reqs, lens, out)
    rc = lib.tr_paged_attention(q.data_ptr(), q.stride(0), kv_layer.data_ptr(), KV_TYPES[kv_layer.dtype], num_blocks,
                                block_size, kvh, nh // kvh, hd, tables.data_ptr(), tables.stride(0), rows.data_ptr(),
                                reqs.data_ptr(), lens.data_ptr(), n, float(scale), out.data_ptr(), out.stride(0),
                                torch.get_num_threads())
    if rc:
        raise MemoryError("the C attention kernel could not allocate its scores")


def _check_attention(q, kv_layer, tables, rows, reqs, lens, out) -> None:
    kvh2, _, _, hd = kv_layer.shape
    t, nh, qhd = q.shape
    if q.dtype != torch.float32 or kv_layer.dtype not in KV_TYPES or out.dtype != torch.float32:
        raise TypeError("the C attention kernel takes float32 q and output, and a float32/float16/bfloat16 cache")
    if q.device.type != "cpu" or kv_layer.device.type != "cpu":
        raise TypeError("the C attention kernel runs on CPU tensors")
    if qhd != hd or q.stride(2) != 1 or q.stride(1) != hd or not kv_layer.is_contiguous():
        raise ValueError("q rows must hold [heads, head_dim] contiguously and the cache layer must be contiguous")
    if out.shape != (t, nh * hd) or out.stride(1) != 1:
        raise ValueError(f"out must be [{t}, {nh * hd}] with contiguous rows")
    if nh % (kvh2 // 2):
        raise ValueError(f"{nh} query heads do not divide into {kvh2 // 2} KV heads")
    for name, a in (("tables", tables), ("rows", rows), ("reqs", reqs), ("lens", lens)):
        if a.dtype != torch.int64 or not a.is_contiguous():
            raise TypeError(f"{name} must be contiguous int64")
    if not (reqs.numel() == lens.numel() == rows.numel()):
        raise ValueError("rows, reqs and lens must have one entry per token")


# ------------------------------------------------------------------ decode_ops.c
# The engine calls these 90-120 times a SmolLM2 step. Each checks what would make the C code
# read or write out of bounds (dtypes, shapes, row strides), which costs more than the call
# itself at batch 1 (about 6 of 8 us); `check=False` skips that for a caller that has checked
# the same shapes already (the fused forward checks its first layer; the others are alike).

_BF16, _F32 = torch.bfloat16, torch.float32


def _rows_ok(t: torch.Tensor, rows: int, cols: int, dtype: torch.dtype, name: str) -> None:
    if t.dtype != dtype or t.dim() != 2 or t.shape[0] != rows or t.shape[1] < cols or t.stride(1) != 1 \
            or t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU {dtype} [{rows}, >= {cols}] tensor with contiguous rows, "
                         f"not {t.dtype} {tuple(t.shape)} strides {t.stride()}")


def _act(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype in (_BF16, _F32) else _F32  # anything else fails the check


def add_rmsnorm(h: torch.Tensor, y: torch.Tensor | None, w: torch.Tensor | None, eps: float,
                out: torch.Tensor | None, check: bool = True) -> None:
    """h += y (in place; y bf16 or float32, or None), then out = rmsnorm(h) * w when out is
    given. h [T, H] float32, w [H] float32, out [T, H] bf16 or float32."""
    lib = load()
    t, n = h.shape
    if check:
        _rows_ok(h, t, n, _F32, "h")
        if y is not None:
            _rows_ok(y, t, n, _act(y), "y")
        if out is not None:
            _rows_ok(out, t, n, _act(out), "out")
            if w is None or w.dtype != _F32 or w.shape != (n,) or not w.is_contiguous():
                raise ValueError(f"w must be a contiguous float32 [{n}] tensor")
    lib.tr_add_rmsnorm(h.data_ptr(), h.stride(0), None if y is None else y.data_ptr(),
                       int(y is not None and y.dtype == _BF16), 0 if y is None else y.stride(0),
                       None if out is None else w.data_ptr(), float(eps), None if out is None else out.data_ptr(),
                       int(out is not None and out.dtype == _BF16), 0 if out is None else out.stride(0),
                       t, n, torch.get_num_threads())


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor, check: bool = True) -> None:
    """out = silu(gate) * up for gate_up [T, 2 I] (gate | up), out [T, I]; each bf16 or float32."""
    lib = load()
    t, i = out.shape
    if check:
        _rows_ok(gate_up, t, 2 * i, _act(gate_up), "gate_up")
        _rows_ok(out, t, i, _act(out), "out")
    lib.tr_silu_mul(gate_up.data_ptr(), int(gate_up.dtype == _BF16), gate_up.stride(0), out.data_ptr(),
                    int(out.dtype == _BF16), out.stride(0), t, i, torch.get_num_threads())


def rope_write(qkv: torch.Tensor, heads: int, kv_heads: int, cis: torch.Tensor, positions: torch.Tensor,
               qk_norm: torch.Tensor | None, eps: float, kv_layer: torch.Tensor, slots: torch.Tensor,
               q_out: torch.Tensor, check: bool = True) -> None:
    """Rotate q and k (after Qwen3's per-head RMSNorm when `qk_norm` [heads + kv_heads, hd] is
    given), write q to q_out [T, heads * hd] float32 and K/V to their `slots` of kv_layer
    [2 * kv_heads, num_blocks, block_size, hd] float32, float16 or bfloat16 (rounded to nearest
    even, as torch's casts). qkv [T, (heads + 2 kv_heads) * hd] bf16
    or float32, interleaved heads; cis [max_len, hd / 2, 2] float32 (cos, sin); positions and
    slots [T] int64 (the caller's to keep in range: the engine's block tables)."""
    lib = load()
    _, nb, bs, hd = kv_layer.shape
    t = qkv.shape[0]
    if check:
        _check_rope(qkv, heads, kv_heads, cis, positions, qk_norm, kv_layer, slots, q_out)
    lib.tr_rope_write(qkv.data_ptr(), int(qkv.dtype == _BF16), qkv.stride(0), t, heads, kv_heads, hd,
                      cis.data_ptr(), positions.data_ptr(), None if qk_norm is None else qk_norm.data_ptr(),
                      float(eps), kv_layer.data_ptr(), KV_TYPES[kv_layer.dtype], nb * bs, slots.data_ptr(),
                      q_out.data_ptr(),
                      q_out.stride(0), torch.get_num_threads())


def _check_rope(qkv, heads, kv_heads, cis, positions, qk_norm, kv_layer, slots, q_out) -> None:
    kvh2, _, _, hd = kv_layer.shape
    t = qkv.shape[0]
    _rows_ok(qkv, t, (heads + kvh2) * hd, _act(qkv), "qkv")
    _rows_ok(q_out, t, heads * hd, _F32, "q_out")
    if kvh2 != 2 * kv_heads or kv_layer.dtype not in KV_TYPES or not kv_layer.is_contiguous() or hd % 2 or hd > 1024:
        raise ValueError("kv_layer must be a contiguous float32/float16/bfloat16 [2 * kv_heads, blocks, block_size, "
                         "head_dim] tensor with an even head_dim of at most 1024")
    if cis.dtype != _F32 or not cis.is_contiguous() or cis.shape[1:] != (hd // 2, 2):
        raise ValueError(f"cis must be a contiguous float32 [max_len, {hd // 2}, 2] tensor")
    for name, a in (("positions", positions), ("slots", slots)):
        if a.dtype != torch.int64 or not a.is_contiguous() or a.numel() != t:
            raise ValueError(f"{name} must be contiguous int64 with one entry per row")
    if qk_norm is not None and (qk_norm.dtype != _F32 or not qk_norm.is_contiguous()
                                or qk_norm.shape != (heads + kv_heads, hd)):
        raise ValueError(f"qk_norm must be a contiguous float32 [{heads + kv_heads}, {hd}] tensor")


# ------------------------------------------------------------------ int4_matmul.c

def int4dp_problem(amx: bool = False) -> str | None:
    """Why the C int4 kernel cannot run here, or None: it needs the C kernels and a CPU with
    AVX-512 BF16 (`vdpbf16ps`), as the build for this host saw it; its `amx` variant also AMX
    tiles with bfloat16 (`tdpbf16ps`) and the Linux kernel's leave to use their state."""
    why = available()
    if why is not None:
        return why
    if not load().tr_int4dp_supported():
        return "this CPU has no AVX-512 BF16 dot products (the build for it leaves the kernel out)"
    if amx and not load().tr_int4amx_supported():
        return "this CPU or its kernel gives no AMX bfloat16 tiles"
    return None


def int4dp_mm(x: torch.Tensor, codes: torch.Tensor, sm: torch.Tensor, n: int, amx: bool = False,
              checked: bool = False) -> torch.Tensor:
    """x [T, K] (bf16 or float32, contiguous rows) @ W.T -> [T, n] float32, W packed as
    `quant.Int4DotWeight` holds it (codes int32 [n/16, K/32, 4, 16], sm float16
    [n/16, K/32, 2, 16]), on AVX-512 dot products or (`amx`) AMX tiles. Checks what would make
    the C code read out of bounds; `checked=True` skips the packed weights' checks for a
    caller that made them once (the engine calls this 121 times a SmolLM2 step, and the
    checks cost more than a small product)."""
    lib = load()
    t, k = x.shape
    if x.dtype not in (_BF16, _F32) or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError(f"x must be a CPU bf16/float32 tensor with contiguous rows, not {x.dtype} {x.stride()}")
    if codes.shape[1] * 32 != k:
        raise ValueError(f"x has {k} columns, the packed matrix {codes.shape[1] * 32}")
    if not checked:
        _check_int4dp_packing(codes, sm, n, k)
    out = torch.empty(t, n, dtype=_F32)
    rc = lib.tr_int4dp_mm(x.data_ptr(), int(x.dtype == _BF16), x.stride(0), t, k, codes.data_ptr(), sm.data_ptr(),
                          n, out.data_ptr(), n, torch.get_num_threads(), int(amx))
    if rc == 1:
        raise MemoryError("the C int4 kernel could not allocate its scratch")
    if rc:
        raise NativeKernelError(f"the C int4 kernel{' on AMX' if amx else ''} is not built for this CPU")
    return out


def _check_int4dp_packing(codes: torch.Tensor, sm: torch.Tensor, n: int, k: int) -> None:
    """ValueError unless codes and sm are the packed form of an [n, k] matrix."""
    if k % 32 or n % 16 or codes.shape != (n // 16, k // 32, 4, 16) or sm.shape != (n // 16, k // 32, 2, 16) \
            or codes.dtype != torch.int32 or sm.dtype != torch.float16 or not (codes.is_contiguous() and sm.is_contiguous()):
        raise ValueError(f"packed int4 weights do not match a [{n}, {k}] matrix")


# ------------------------------------------------------------------ int4_avx2.c

I4X_ISAS = {0: None, 1: "avx2", 2: "avx-vnni", 3: "avx512-vnni"}
I4X_BITS = (8, 16)  # activations as int8, or as two int8 digits (~15 bits)


def int4x_problem(lib=None) -> str | None:
    """Why the integer int4 kernel (`csrc/int4_avx2.c`) cannot run here, or None: it needs the
    C kernels and AVX2 with FMA and F16C, as the build for this host saw them."""
    if lib is None:
        why = available()
        if why is not None:
            return why
        lib = load()
    if not lib.tr_i4x_isa():
        return "this CPU has no AVX2 with FMA and F16C (the build for it leaves the integer int4 kernel out)"
    return None


def int4x_isa(lib=None) -> str | None:
    """The instructions the integer int4 kernel runs on in this build: "avx2", "avx-vnni",
    "avx512-vnni", or None."""
    return I4X_ISAS[(lib or load()).tr_i4x_isa()]


def check_int4x_rc(rc: int, what: str) -> None:
    """Raise for a nonzero return code of the integer int4 kernel: 1 no memory, 2 not built for
    this CPU, else refused."""
    if rc == 1:
        raise MemoryError(f"the integer int4 kernel's {what} could not allocate its scratch")
    if rc == 2:
        raise NativeKernelError("the integer int4 kernel is not built for this CPU (no AVX2 + FMA + F16C)")
    if rc:
        raise ValueError(f"the integer int4 kernel's {what} refused its arguments")


def int4x_pack(codes: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, lib=None) -> torch.Tensor:
    """The kernel's packed form (uint8, `tr_i4x_packed_bytes` long) of the [N, K] matrix
    w = s q + m: codes in 0..15, s and m [N, K / 32] float32 (m None: 0), held as float16."""
    lib = lib or load()
    n, k = codes.shape
    if k % 32 or s.shape != (n, k // 32) or (m is not None and m.shape != s.shape):
        raise ValueError(f"codes [{n}, {k}] need K % 32 == 0 and scales/mins of shape [{n}, {k // 32}]")
    codes = codes.to(torch.uint8).contiguous()
    s = s.to(_F32).contiguous()
    m = None if m is None else m.to(_F32).contiguous()
    packed = torch.empty(lib.tr_i4x_packed_bytes(n, k), dtype=torch.uint8)
    check_int4x_rc(lib.tr_i4x_pack(codes.data_ptr(), s.data_ptr(), None if m is None else m.data_ptr(), n, k,
                            packed.data_ptr()), "packing")
    return packed


def int4x_mm(x: torch.Tensor, packed: torch.Tensor, n: int, xbits: int = 16, out: torch.Tensor | None = None,
             checked: bool = False, threads: int | None = None, lib=None) -> torch.Tensor:
    """x [T, K] (bf16 or float32, contiguous rows, any row stride) @ W.T -> [T, n] float32 (into
    `out`'s first n columns when given: float32 rows, any row stride), W as `int4x_pack` packed
    it, x quantised per row and group of 32 to `xbits` (16: exact enough for the 99% bar; 8:
    llama.cpp's int8). Checks what would make the C code read or write out of bounds;
    `checked=True` skips the packed weights' size check for a caller that made it once."""
    lib = lib or load()
    t, k = x.shape
    if x.dtype not in (_BF16, _F32) or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError(f"x must be a CPU bf16/float32 tensor with contiguous rows, not {x.dtype} {x.stride()}")
    if xbits not in I4X_BITS:
        raise ValueError(f"xbits must be 8 or 16, not {xbits}")
    if not checked and (k % 32 or packed.dtype != torch.uint8 or not packed.is_contiguous()
                        or packed.numel() != lib.tr_i4x_packed_bytes(n, k)):
        raise ValueError(f"the packed int4 weights do not match a [{n}, {k}] matrix")
    if out is None:
        out = torch.empty(t, n, dtype=_F32)
    elif not checked:
        _rows_ok(out, t, n, _F32, "out")
    check_int4x_rc(lib.tr_i4x_mm(x.data_ptr(), int(x.dtype == _BF16), x.stride(0), t, k, xbits, packed.data_ptr(), n,
                          out.data_ptr(), out.stride(0), None,
                          torch.get_num_threads() if threads is None else threads), "product")
    return out


def int4x_quantize(x: torch.Tensor, xbits: int = 16, lib=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's own quantisation of x's rows (for tests): (Q int32 [T, K], dx, sx [T, K / 32]),
    x ~ Q dx per group of 32, sx = dx sum Q; 16 bits: Q = 254 q1 + q2 from its two int8 digits."""
    lib = lib or load()
    t, k = x.shape
    if k % 32 or x.stride(1) != 1 or x.dtype not in (_BF16, _F32) or xbits not in I4X_BITS:
        raise ValueError("x must be bf16/float32 with contiguous rows of a multiple of 32 columns")
    buf = torch.zeros(lib.tr_i4x_scratch_bytes(t, k), dtype=torch.uint8)
    check_int4x_rc(lib.tr_i4x_quantize(x.data_ptr(), int(x.dtype == _BF16), x.stride(0), t, k, xbits, buf.data_ptr()),
            "quantisation")
    plane = (t * k + 63) // 64 * 64  # the scratch layout: two code planes, then (dx, sx) pairs
    q = buf[:t * k].view(torch.int8).view(t, k).to(torch.int32)
    if xbits == 16:
        q = 254 * q + buf[plane:plane + t * k].view(torch.int8).view(t, k).to(torch.int32)
    f = buf[2 * plane:2 * plane + t * (k // 32) * 8].view(_F32).view(t, k // 32, 2)
    return q, f[..., 0].clone(), f[..., 1].clone()


# ------------------------------------------------------------------ head_rescore.c

RESCORE_MAX_K = 64


def rescore_top(lg: torch.Tensor, h: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int) -> None:
    """In place: each row's k highest logits of lg [T, V] (float32, contiguous rows)
    recomputed in float32 from int8 `codes` [V, H] with float32 `scales` [V, H / group] and
    h [T, H] float32 (`csrc/head_rescore.c`: ties to the lower index, each row alone)."""
    v, hdim = lg.shape[1], h.shape[1]
    if codes.dtype != torch.int8 or codes.shape != (v, hdim) or not codes.is_contiguous():
        raise ValueError(f"codes must be contiguous int8 [{v}, {hdim}]")
    if scales.dtype != _F32 or scales.dim() != 2 or scales.shape[0] != v or not scales.is_contiguous() \
            or hdim % scales.shape[1]:
        raise ValueError(f"scales must be contiguous float32 [{v}, groups] with groups dividing {hdim}")
    _rescore(lg, h, k, -1, codes, scales, hdim // scales.shape[1])


def rescore_top_blocks(lg: torch.Tensor, h: torch.Tensor, ggml_type: int, blocks: torch.Tensor, k: int) -> None:
    """`rescore_top` from the rows of a GGUF matrix: `blocks` uint8 [V, row bytes] of ggml type
    `ggml_type` (`blocks.BlockRows`, which checks their shape), rows with unit stride."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[0] != lg.shape[1] or blocks.stride(1) != 1:
        raise ValueError(f"blocks must be uint8 [{lg.shape[1]}, row bytes] with contiguous rows")
    _rescore(lg, h, k, ggml_type, blocks, None, 0)


def _rescore(lg, h, k, kind, data, scales, group) -> None:
    lib = load()
    t, v = lg.shape
    hdim = h.shape[1]
    _rows_ok(lg, t, v, _F32, "lg")
    _rows_ok(h, t, hdim, _F32, "h")
    if not 1 <= k <= min(v, RESCORE_MAX_K):
        raise ValueError(f"k must be in 1..{min(v, RESCORE_MAX_K)}, not {k}")
    rc = lib.tr_rescore_top(lg.data_ptr(), lg.stride(0), t, v, h.data_ptr(), h.stride(0), hdim, kind, data.data_ptr(),
                            data.stride(0), None if scales is None else scales.data_ptr(), group, k,
                            torch.get_num_threads())
    if rc == 1:
        raise MemoryError("the rescoring kernel could not allocate a row")
    if rc:
        raise ValueError("the rescoring kernel refused its arguments")
