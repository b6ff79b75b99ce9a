"""Portable paged attention: gather each request's K/V by its block table, then attend.

Runs wherever torch runs (CPU, CUDA). A step's tokens are flattened to [T, ...] in request
order. Requests are grouped so that one batched matmul serves many of them:

- requests with at most `SHORT_Q` new tokens (decodes, short extends) are grouped by their
  *own* padded shape: new tokens rounded up to a power of two, context blocks rounded up to a
  power of two (`short_shape`). A group's batched products then have the shape each of its
  requests would get alone, so a request's values never depend on what else shares its step
  (batch invariance: with bfloat16 activations a 1e-7 difference in attention becomes a
  one-ulp flip in a quantised layer's input and, measured, a 0.25 logit difference);
- each longer request (a prefill chunk) is its own group, so a long prompt never pads the
  decodes that share its step.

Grouped-query attention is done without repeating K/V: the query heads that share a KV head
are stacked as extra query rows. Masks and gather indices are built once per step
(`build_meta`) and reused by every layer. The short group's attention is two batched
matrix multiplies around a softmax; a prefill chunk uses torch's fused kernel.

On CPU in float32 the short requests can go instead to a C kernel (`kernels/bindings.py`,
`build_meta(native=True)`, chosen per engine by `Engine`): one call per layer for all of
them, each token attending to its own request's keys where they lie in the cache, with no
gather and no padding (each token is computed alone, so batch invariance holds by
construction); prefill chunks still take torch's fused kernel. Which path is faster differs
by host and thread count, so it is measured (`prefer_native`) and cached, not assumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenrouter.runtime.cache import cache_root, write_json
from tokenrouter.runtime.kernels import bindings
from tokenrouter.runtime.kernels.build import source_hash
from tokenrouter.runtime.kernels.plan import host_key

SHORT_Q = 16


@dataclass
class AttnGroup:
    rows: torch.Tensor  # [b, Qmax] indices into the step's T tokens (padding repeats a valid row)
    kv_blocks: torch.Tensor  # [b, nb] each request's block table (padding: block 0)
    kv_rows: torch.Tensor  # [2 * kv_heads * b * nb] those blocks as rows of the flat per-layer cache
    # additive mask (0 or -inf) over nb * block_size positions: [kv_heads, b, Qmax * group, L]
    # for the short group (one row per batched product), [1, 1, Qmax, L] for a prefill chunk;
    # None for a prefill from position 0, which is plainly causal (`causal`)
    mask: torch.Tensor | None
    out_rows: torch.Tensor | None  # flat indices into [b * Qmax] of real tokens; None: all real, in order
    dest: torch.Tensor | None  # where those rows go among the T tokens; None: the whole group is T
    causal: bool = False


@dataclass
class NativeShort:
    """Every short request's tokens for the C kernel (`bindings.paged_attention`): each token
    attends to its own request's first `lens` keys, read where they lie in the cache."""
    rows: torch.Tensor  # [n] the tokens' indices among the step's T
    reqs: torch.Tensor  # [n] each token's row in `tables`
    lens: torch.Tensor  # [n] keys each token attends to (its position + 1)
    tables: torch.Tensor  # [b, nb] the short requests' block tables (padding: block 0)


@dataclass
class AttnMeta:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    groups: list[AttnGroup]
    num_tokens: int
    native: NativeShort | None = None  # the short requests, when the C kernel serves them


@dataclass(frozen=True)
class CacheGeometry:
    block_size: int
    num_blocks: int  # blocks per head in the cache, padding blocks included
    kv_heads: int
    q_per_kv: int

    def kv_rows(self, blocks: torch.Tensor) -> torch.Tensor:
        """Rows of the flat [2 * kv_heads * num_blocks, block_size * head_dim] cache holding
        `blocks` [b, nb] for every K then V head, in [head, b, nb] order."""
        heads = torch.arange(0, 2 * self.kv_heads * self.num_blocks, self.num_blocks, device=blocks.device)
        return (heads[:, None] + blocks.reshape(1, -1)).reshape(-1)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def short_shape(q_len: int, kv_len: int, block_size: int) -> tuple[int, int]:
    """(padded new tokens, padded context blocks) of a short request: a function of the
    request alone, which is what makes its group's arithmetic independent of the batch."""
    return _pow2(q_len), _pow2(-(-kv_len // block_size))


def build_group(reqs: list[tuple[int, int, int, list[int]]], geo: CacheGeometry, dtype: torch.dtype,
                device: torch.device | str, num_tokens: int, short: bool,
                shape: tuple[int, int] | None = None) -> AttnGroup:
    """reqs: (first token index in T, new tokens, context length after the step, block table);
    `shape`: (new tokens, context blocks) to pad to, else the group's largest.
    A group that is the whole step, unpadded and in order, needs no scatter (dest None)."""
    b = len(reqs)
    q_max = max(q for _, q, _, _ in reqs)
    nb = -(-max(n for _, _, n, _ in reqs) // geo.block_size)
    if shape is not None:
        q_max, nb = max(q_max, shape[0]), max(nb, shape[1])
    tables = torch.tensor([bt[:nb] + [0] * (nb - len(bt[:nb])) for _, _, _, bt in reqs], dtype=torch.long)
    q_len = torch.tensor([q for _, q, _, _ in reqs])
    kv_len = torch.tensor([n for _, _, n, _ in reqs])
    first = torch.tensor([t0 for t0, _, _, _ in reqs])
    j = torch.arange(q_max)
    rows = first[:, None] + torch.minimum(j[None, :], q_len[:, None] - 1)  # pad by repeating the last row
    causal = not short and bool(kv_len[0] == q_len[0])  # a prefill from 0: keys past it are never reached
    mask = None
    if not causal:
        pos = torch.arange(nb * geo.block_size)
        qpos = (kv_len - q_len)[:, None] + torch.minimum(j[None, :], q_len[:, None] - 1)  # [b, Qmax]
        allowed = (pos[None, None, :] <= qpos[:, :, None]) & (pos[None, None, :] < kv_len[:, None, None])
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
        if short:  # one row per (KV head, request, query row, query head sharing it)
            mask = mask.repeat_interleave(geo.q_per_kv, dim=1).expand(geo.kv_heads, -1, -1, -1).contiguous()
        else:
            mask = mask.unsqueeze(0)  # [1, 1, Qmax, L]
        mask = mask.to(device)
    real = (j[None, :] < q_len[:, None]).reshape(-1)
    out_rows = dest = None
    if not (num_tokens == b * q_max and torch.equal(rows.reshape(-1), torch.arange(num_tokens))):
        out_rows = real.nonzero().squeeze(1)
        dest = rows.reshape(-1)[out_rows]
    tables = tables.to(device)
    return AttnGroup(rows=rows.to(device), kv_blocks=tables, kv_rows=geo.kv_rows(tables), mask=mask,
                     out_rows=None if out_rows is None else out_rows.to(device),
                     dest=None if dest is None else dest.to(device), causal=causal)


def build_native(reqs: list[tuple[int, int, int, list[int]]], geo: CacheGeometry) -> NativeShort:
    """The C kernel's view of the short requests: one entry per token, with the number of
    keys it sees (causal within its request). Block ids are checked here, once per step,
    because the kernel reads wherever they point."""
    rows, owner, lens, tables = [], [], [], []
    nb = max(-(-n // geo.block_size) for _, _, n, _ in reqs)
    for i, (t0, q, n, bt) in enumerate(reqs):
        need = -(-n // geo.block_size)
        if len(bt) < need or not all(0 <= b < geo.num_blocks for b in bt[:need]):
            raise ValueError(f"block table {bt[:need]} does not cover {n} positions in {geo.num_blocks} blocks")
        tables.append(bt[:need] + [0] * (nb - need))
        for j in range(q):
            rows.append(t0 + j)
            owner.append(i)
            lens.append(n - q + j + 1)
    return NativeShort(rows=torch.tensor(rows), reqs=torch.tensor(owner), lens=torch.tensor(lens),
                       tables=torch.tensor(tables, dtype=torch.long))


def build_meta(q_lens: list[int], kv_lens: list[int], block_tables: list[list[int]], slots: list[int],
               geo: CacheGeometry, dtype: torch.dtype, device: torch.device | str,
               native: bool = False) -> AttnMeta:
    """Attention metadata for one forward over requests with the given new-token counts,
    context lengths after the step and block tables; `slots` are the new tokens' cache slots.
    `native`: the short requests go to the C kernel (CPU, float32) instead of batched groups."""
    starts, t = [], 0
    for q in q_lens:
        starts.append(t)
        t += q
    reqs = list(zip(starts, q_lens, kv_lens, block_tables))
    short_reqs = [r for r in reqs if r[1] <= SHORT_Q]
    slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
    if native:
        groups = [build_group([r], geo, dtype, device, num_tokens=t, short=False) for r in reqs if r[1] > SHORT_Q]
        return AttnMeta(slot_mapping=slot_mapping, groups=groups, num_tokens=t,
                        native=build_native(short_reqs, geo) if short_reqs else None)
    short: dict[tuple[int, int], list] = {}
    for r in short_reqs:
        short.setdefault(short_shape(r[1], r[2], geo.block_size), []).append(r)
    groups = [build_group(rs, geo, dtype, device, num_tokens=t, short=True, shape=shp) for shp, rs in short.items()]
    for r in reqs:
        if r[1] > SHORT_Q:
            groups.append(build_group([r], geo, dtype, device, num_tokens=t, short=False))
    return AttnMeta(slot_mapping=slot_mapping, groups=groups, num_tokens=t)


def paged_attention(q: torch.Tensor, kv_cache, layer: int, meta: AttnMeta, scale: float) -> torch.Tensor:
    """q [T, heads, head_dim]; `kv_cache` (a `KVCache`) already holds this step's K/V for
    `layer`. Returns [T, heads * head_dim].

    The short group is two batched matrix multiplies around a softmax: at decode sizes
    (a few query rows per head) torch's fused CPU kernel spends its time on per-head
    tiling. A prefill chunk uses the fused kernel, which never materialises its scores,
    with grouped-query heads and, from position 0, its causal mode instead of a mask."""
    t, nh, hd = q.shape
    kvh = kv_cache.kv_heads
    g = nh // kvh
    out = None
    if meta.native is not None:
        out = q.new_empty(t, nh * hd)
        n = meta.native
        # every layer of a forward has layer 0's shapes: the wrapper checks them there
        bindings.paged_attention(q, kv_cache.layers[layer], n.tables, n.rows, n.reqs, n.lens, scale, out,
                                 check=layer == 0)
    for grp in meta.groups:
        b, qm = grp.rows.shape
        qg = q if grp.dest is None else q.index_select(0, grp.rows.view(-1))
        # one gather of whole blocks, every head's copy of them, as rows of the flat cache
        # (2x faster here than index_select along the block dimension)
        kv = kv_cache.gather(layer, grp.kv_rows).view(2 * kvh * b, -1, hd)
        if kv.dtype != q.dtype:  # a half-precision cache, widened for the products
            kv = kv.to(q.dtype)
        length = kv.shape[1]
        k, v = kv[:kvh * b], kv[kvh * b:]
        if qm <= SHORT_Q:
            # the query heads sharing a KV head are its query rows: [kv_heads * b, qm * g, hd]
            qh = qg.view(b, qm, kvh, g, hd).permute(2, 0, 1, 3, 4).reshape(kvh * b, qm * g, hd)
            s = torch.baddbmm(grp.mask.view(kvh * b, qm * g, length), qh, k.transpose(1, 2), alpha=scale)
            o = torch.bmm(s.softmax(-1), v)
            o = o.view(kvh, b, qm, g, hd).permute(1, 2, 0, 3, 4).reshape(b * qm, nh * hd)
        else:  # one request (b == 1)
            o = F.scaled_dot_product_attention(qg.view(1, qm, nh, hd).transpose(1, 2), k.unsqueeze(0),
                                               v.unsqueeze(0), attn_mask=grp.mask, is_causal=grp.causal,
                                               scale=scale, enable_gqa=True)
            o = o.transpose(1, 2).reshape(qm, nh * hd)
        if grp.dest is None:
            return o
        if out is None:
            out = q.new_empty(t, nh * hd)
        out.index_copy_(0, grp.dest, o.index_select(0, grp.out_rows))
    return out


# ------------------------------------------------------------------ which path: measured on this host

# (requests, keys each) a choice is timed at: decode batches at short and long contexts
CHOICE_SHAPES = ((1, 256), (8, 256), (1, 1024), (8, 1024))


def _time_paths(kv_cache, geo, heads: int, layers: int, rounds: int = 3) -> dict[str, dict[str, float]]:
    """ms per step (all layers) of torch's path and the C kernel at each `CHOICE_SHAPES` shape
    that fits the cache, on the engine's own cache (values do not change the time), best of
    `rounds`, the two paths interleaved so load hits both alike."""
    hd = kv_cache.kv.shape[-1]
    out: dict[str, dict[str, float]] = {"torch": {}, "native": {}}
    usable = geo.num_blocks - 1
    with torch.inference_mode():
        for b, n in CHOICE_SHAPES:
            nb = -(-n // geo.block_size)
            if b * nb > usable:
                continue
            tables = [list(range(1 + i * nb, 1 + (i + 1) * nb)) for i in range(b)]
            dtype = torch.float32 if kv_cache.kv.dtype in (torch.float16, torch.bfloat16) else kv_cache.kv.dtype
            q = torch.zeros(b, heads, hd, dtype=dtype)
            metas = {path: build_meta([1] * b, [n] * b, tables, [0] * b, geo, q.dtype, "cpu", native=path == "native")
                     for path in out}
            key = f"{b}x{n}"
            for r in range(rounds + 1):  # round 0 warms up
                for path, meta in metas.items():
                    t0 = time.perf_counter()
                    for layer in range(layers):
                        paged_attention(q, kv_cache, layer, meta, 1.0)
                    dt = (time.perf_counter() - t0) * 1e3
                    if r:
                        out[path][key] = min(out[path].get(key, float("inf")), dt)
    return out


def prefer_native(kv_cache, geo, heads: int, layers: int, cache_path: str | None = None) -> bool:
    """Whether the C kernel is faster than torch's path on this host, for this cache geometry
    and thread count: measured once (`_time_paths`, well under a second on SmolLM2) and cached
    at `cache_path`; the C kernel wins if its mean time ratio over the shapes is below 1. A
    cache too small for any shape measures nothing and caches nothing (torch's path), so it
    never decides for a larger cache of the same geometry. Its rounding differs from torch's,
    so the choice is made once per engine, never per step."""
    if cache_path and os.path.isfile(cache_path):
        try:
            with open(cache_path) as f:
                return bool(json.load(f)["native"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    times = _time_paths(kv_cache, geo, heads, layers)
    keys = list(times["native"])
    if not keys:  # no shape fits this cache: torch's path, and nothing cached for a larger one
        return False
    ratio = sum(times["native"][k] / times["torch"][k] for k in keys) / len(keys)
    native = ratio < 1.0
    if cache_path:
        write_json(cache_path, {"native": native, "mean_ratio_native_over_torch": ratio, "ms_per_step": times,
                                 "threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
                                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return native


def choice_path(geo, heads: int, head_dim: int, layers: int, kv_dtype: torch.dtype = torch.float32) -> str:
    """Where the choice for (host, threads, cache geometry and element type) is cached."""
    key = {"host": host_key(), "geometry": [geo.block_size, geo.kv_heads, geo.q_per_kv, heads, head_dim, layers],
           "source": source_hash()}
    if kv_dtype != torch.float32:  # (float32 caches keep the key they had)
        key["kv_dtype"] = str(kv_dtype)
    key = json.dumps(key, sort_keys=True)
    return os.path.join(cache_root(), "attention-choice", hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")
