"""Paged KV-cache bookkeeping: blocks, per-sequence block tables, reference counts.

Integers only (no tensors), so the scheduler's view of memory is tested without a model.

- A block is free when no one references it. A sequence references each block of its table
  until it is freed, and appends take only free blocks, so a sequence's blocks are never
  handed to anyone else while it lives (a request pending at a peer holds its KV so, until
  the frontend's release frees it).
- Optional prefix reuse: a full block is registered under (chained hash of the blocks
  before it, its own tokens) once its KV has been computed (`mark_computed`); a *new*
  sequence whose prompt starts with registered blocks shares them (reference count > 1)
  instead of recomputing them.
  Freed registered blocks stay matchable until they are reallocated (least recently freed
  first). Only full blocks are shared and appends always go to a sequence's own last
  block, so shared blocks are never written.
- Fork (`fork`): a new sequence takes the first n tokens of a live one (the prompt that
  `n` > 1 choices share). It references the full blocks of those n tokens (reference
  count + 1 each) and gets a fresh block for the partial block after them, if any, whose
  KV the caller copies (`Fork.copy`). Copied at the fork rather than on the first write:
  that write comes at once (the child's next token lands in that block, and the parent has
  already written past n in it), so copy on write would copy the same block a step later
  and add a check to every append. The rule stays: a sequence writes only blocks it alone
  references.
- `free` drops a sequence's references; a block returns to the free pool only when its
  count reaches zero.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


class OutOfBlocks(RuntimeError):
    """Not enough free KV blocks for the requested append (check `can_append` first)."""


@dataclass
class _Seq:
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # kept only with prefix reuse
    num_tokens: int = 0
    hashes: list[int] = field(default_factory=list)  # chained hash of each registered full block


@dataclass(frozen=True)
class Append:
    """Where an append's tokens go: `cached` leading tokens were reused from the prefix
    cache (no compute), the rest land in `slots` (block * block_size + offset), starting at
    position `start`."""

    start: int
    cached: int
    slots: list[int]


@dataclass(frozen=True)
class Fork:
    """A fork's one copy: the KV of block `copy[0]` goes to block `copy[1]` (None: the fork
    ended on a block boundary, nothing to copy)."""

    copy: tuple[int, int] | None


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_reuse: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_reuse = prefix_reuse
        self._ref = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._seqs: dict[object, _Seq] = {}
        # prefix reuse: (parent chain hash, block tokens) <-> block, for computed full blocks
        self._key_to_block: dict[tuple, int] = {}
        self._block_key: dict[int, tuple] = {}

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def seq_len(self, seq_id: object) -> int:
        s = self._seqs.get(seq_id)
        return 0 if s is None else s.num_tokens

    def block_table(self, seq_id: object) -> list[int]:
        return list(self._seqs[seq_id].blocks)

    def blocks_needed(self, seq_id: object, n_tokens: int) -> int:
        """New blocks an append of n_tokens needs (ignoring any prefix reuse: an upper bound)."""
        s = self._seqs.get(seq_id)
        have, length = (0, 0) if s is None else (len(s.blocks), s.num_tokens)
        return max(0, -(-(length + n_tokens) // self.block_size) - have)

    def can_append(self, appends: list[tuple[object, int]]) -> bool:
        need = sum(self.blocks_needed(sid, n) for sid, n in appends)
        return need <= self.num_free

    # ---- mutation ------------------------------------------------------------------
    def append(self, seq_id: object, tokens: list[int]) -> Append:
        """Extend seq_id (created on first use) by tokens and return where their KV goes."""
        s = self._seqs.get(seq_id)
        new = s is None
        if new:
            s = _Seq()
        if self.blocks_needed(seq_id, len(tokens)) > self.num_free:
            raise OutOfBlocks(f"{seq_id!r} needs more KV blocks than are free ({self.num_free})")
        if new:
            self._seqs[seq_id] = s
        start = s.num_tokens
        cached = self._match_prefix(s, tokens) if new and self.prefix_reuse else 0
        bs = self.block_size
        while len(s.blocks) * bs < start + len(tokens):
            s.blocks.append(self._take())
        if self.prefix_reuse:
            s.tokens.extend(tokens[cached:])
        s.num_tokens = start + len(tokens)
        slots = [s.blocks[p // bs] * bs + p % bs for p in range(start + cached, s.num_tokens)]
        return Append(start=start, cached=cached, slots=slots)

    def mark_computed(self, seq_id: object) -> None:
        """All of seq_id's tokens now have KV written: register its full blocks for reuse."""
        s = self._seqs.get(seq_id)
        if s is None:
            return
        if self.prefix_reuse:
            bs = self.block_size
            parent = s.hashes[-1] if s.hashes else 0
            for i in range(len(s.hashes), s.num_tokens // bs):
                key = (parent, tuple(s.tokens[i * bs:(i + 1) * bs]))
                parent = hash(key)
                s.hashes.append(parent)
                b = s.blocks[i]
                if key not in self._key_to_block and b not in self._block_key:
                    self._key_to_block[key] = b
                    self._block_key[b] = key

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def fork(self, parent: object, child: object, n_tokens: int) -> Fork:
        """A new sequence `child` holding `parent`'s first n_tokens (at most its length): it
        shares their full blocks and gets a copy of the partial one after them."""
        p = self._seqs.get(parent)
        if p is None:
            raise KeyError(f"cannot fork {parent!r}: no such sequence")
        if child in self._seqs:
            raise KeyError(f"cannot fork into {child!r}: it exists")
        if not 0 <= n_tokens <= p.num_tokens:
            raise ValueError(f"cannot fork {n_tokens} tokens of {parent!r}, which holds {p.num_tokens}")
        bs = self.block_size
        full, part = divmod(n_tokens, bs)
        if part and not self._free:
            raise OutOfBlocks(f"forking {parent!r} needs a free KV block (none is free)")
        c = _Seq(blocks=list(p.blocks[:full]), num_tokens=n_tokens)
        for b in c.blocks:
            self._ref[b] += 1
        if self.prefix_reuse:
            c.tokens = list(p.tokens[:n_tokens])
            c.hashes = list(p.hashes[:full])
        copy = None
        if part:
            c.blocks.append(self._take())
            copy = (p.blocks[full], c.blocks[-1])
        self._seqs[child] = c
        return Fork(copy)

    def free(self, seq_id: object) -> None:
        """Release seq_id's blocks. Unknown ids are a no-op."""
        if seq_id in self._seqs:
            self._release(seq_id)

    # ---- internals -----------------------------------------------------------------
    def _release(self, seq_id: object) -> None:
        s = self._seqs.pop(seq_id)
        for b in reversed(s.blocks):  # the tail is the least reusable: reallocate it first
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if b not in self._block_key:
                    self._free.move_to_end(b, last=False)

    def _take(self) -> int:
        b, _ = self._free.popitem(last=False)
        key = self._block_key.pop(b, None)
        if key is not None:
            del self._key_to_block[key]
        self._ref[b] = 1
        return b

    def _match_prefix(self, s: _Seq, tokens: list[int]) -> int:
        """Share registered full blocks with a new sequence; keep at least one token to compute."""
        bs = self.block_size
        n, parent = 0, 0
        while (n + 1) * bs < len(tokens):
            key = (parent, tuple(tokens[n * bs:(n + 1) * bs]))
            b = self._key_to_block.get(key)
            if b is None:
                break
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            s.blocks.append(b)
            parent = hash(key)
            s.hashes.append(parent)
            n += 1
        s.tokens.extend(tokens[: n * bs])
        return n * bs
