"""CUDA graphs for decode and short extends (CUDA only; UNVERIFIED until run on a GPU).

A step whose requests all add the same small number of tokens q (1 for decode, a few for a
returning request's extend) replays a graph captured for (batch bucket, q, context bucket):
the batch is padded up to the bucket (padding rows write to a reserved scratch block and
attend only to it) and the gathered context is padded to the bucket's length, so every
tensor has a static shape. The context bucket is part of the key because the portable
attention gathers the context into a dense tensor. Anything else (mixed q, bigger batches,
longer contexts, prefills) runs eagerly. Graphs are captured lazily on first use and share
one memory pool. On CPU the engine never builds a runner (see benchmarks/bench_engine.py
for the measured `torch.compile` alternative).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrouter.runtime.engine.attention import AttnGroup, AttnMeta, CacheGeometry, build_group

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
MAX_Q = 4
CTX_BUCKETS = (256, 1024, 4096)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: static shapes run eagerly (capture=False)
    ids: torch.Tensor
    pos: torch.Tensor
    meta: AttnMeta
    last_rows: torch.Tensor
    hidden: dict[int, torch.Tensor]  # the graph's static outputs, -1 = the final-normed state


class GraphRunner:
    """capture=False runs the same padded static-shape steps eagerly, on any device: it is
    how the padding and bucketing are tested without a GPU."""

    def __init__(self, model, kv, geo: CacheGeometry, pad_block: int, max_len: int, capture: bool = True):
        self.model, self.kv, self.geo, self.capture = model, kv, geo, capture
        self.block_size, self.pad_block = geo.block_size, pad_block
        self.pad_slot = pad_block * geo.block_size
        self.ctx_buckets = tuple(c for c in CTX_BUCKETS if c < max_len) + (max_len,)
        self.layers = tuple(range(model.config.num_hidden_layers + 1)) + (-1,)
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def key(self, q_lens: list[int], kv_lens: list[int]) -> tuple[int, int, int] | None:
        q = q_lens[0]
        if q > MAX_Q or any(x != q for x in q_lens) or len(q_lens) > BATCH_BUCKETS[-1]:
            return None
        b = next(x for x in BATCH_BUCKETS if x >= len(q_lens))
        ctx = next((c for c in self.ctx_buckets if c >= max(kv_lens)), None)
        return None if ctx is None else (b, q, ctx)

    def _static(self, b: int, q: int, ctx: int) -> tuple[torch.Tensor, torch.Tensor, AttnMeta, torch.Tensor]:
        dev, dt = self.kv.kv.device, self.kv.kv.dtype
        geo = self.geo
        nb = -(-ctx // self.block_size)
        blocks = torch.full((b, nb), self.pad_block, dtype=torch.long, device=dev)
        group = AttnGroup(rows=torch.arange(b * q, device=dev).view(b, q), kv_blocks=blocks,
                          kv_rows=geo.kv_rows(blocks),
                          mask=torch.zeros((geo.kv_heads, b, q * geo.q_per_kv, nb * self.block_size),
                                           dtype=dt, device=dev),
                          out_rows=None, dest=None)
        meta = AttnMeta(slot_mapping=torch.full((b * q,), self.pad_slot, dtype=torch.long, device=dev),
                        groups=[group], num_tokens=b * q)
        ids = torch.zeros(b * q, dtype=torch.long, device=dev)
        pos = torch.zeros(b * q, dtype=torch.long, device=dev)
        last = torch.arange(b, device=dev) * q + (q - 1)
        return ids, pos, meta, last

    def _capture(self, key: tuple[int, int, int]) -> _Graph:
        ids, pos, meta, last = self._static(*key)
        self._fill(meta, key, [], [], [], [])  # all rows are padding: safe to run
        if not self.capture:
            return _Graph(None, ids, pos, meta, last, {})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model.forward(ids, pos, meta, self.kv, last, self.layers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out, hidden = self.model.forward(ids, pos, meta, self.kv, last, self.layers)
        hidden = dict(hidden)
        hidden[-1] = out
        return _Graph(graph, ids, pos, meta, last, hidden)

    def _fill(self, meta: AttnMeta, key, q_lens, kv_lens, tables, slots) -> None:
        b_pad, q, ctx = key
        grp = meta.groups[0]
        grp.kv_blocks.fill_(self.pad_block)
        grp.mask.fill_(float("-inf"))
        grp.mask[..., 0] = 0.0  # padding rows attend to the scratch block's first slot only
        meta.slot_mapping.fill_(self.pad_slot)
        b = len(q_lens)
        if b:
            t0 = [i * q for i in range(b)]
            real = build_group(list(zip(t0, q_lens, kv_lens, tables)), self.geo, grp.mask.dtype, grp.mask.device,
                                     num_tokens=b * q, short=True)
            nb = real.kv_blocks.shape[1]
            grp.kv_blocks[:b, :nb].copy_(real.kv_blocks)
            grp.mask[:, :b, :, :nb * self.block_size].copy_(real.mask)
            meta.slot_mapping[: b * q].copy_(torch.tensor(slots, dtype=torch.long), non_blocking=True)
        grp.kv_rows.copy_(self.geo.kv_rows(grp.kv_blocks))

    def run(self, ids: list[int], pos: list[int], slots: list[int], q_lens: list[int], kv_lens: list[int],
            tables: list[list[int]], layers: tuple[int, ...]):
        """Replay the bucket's graph for this step, or return None when it has no bucket."""
        key = self.key(q_lens, kv_lens)
        if key is None:
            return None
        gr = self.graphs.get(key)
        if gr is None:
            gr = self.graphs[key] = self._capture(key)
        b = len(q_lens)
        n = b * key[1]
        gr.ids.zero_()
        gr.pos.zero_()
        gr.ids[:n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        gr.pos[:n].copy_(torch.tensor(pos, dtype=torch.long), non_blocking=True)
        self._fill(gr.meta, key, q_lens, kv_lens, tables, slots)
        if gr.graph is None:
            out, hidden = self.model.forward(gr.ids, gr.pos, gr.meta, self.kv, gr.last_rows, layers)
            return out[:b], {k: t[:b] for k, t in hidden.items()}
        gr.graph.replay()
        # copies: the next replay overwrites the graph's static outputs
        return gr.hidden[-1][:b].clone(), {k: gr.hidden[k][:b].clone() for k in layers}
