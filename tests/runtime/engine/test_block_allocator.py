"""Allocator properties (hypothesis): no block owned twice, a live sequence's blocks never
reused, everything free again when all requests end; prefix sharing only of identical prefixes."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tokenrouter.runtime.engine.block_allocator import BlockAllocator, OutOfBlocks

SEQS = st.integers(0, 5)
TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=11)  # tiny vocab: prefixes collide often


class AllocatorMachine(RuleBasedStateMachine):
    """A model of what each sequence holds, checked against the allocator after every op."""

    def __init__(self, prefix_reuse: bool):
        super().__init__()
        self.a = BlockAllocator(12, 3, prefix_reuse=prefix_reuse)
        self.tokens: dict[int, list[int]] = {}  # live sequences
        self.tables: dict[int, list[int]] = {}  # their block tables after their last append

    @rule(sid=SEQS, toks=TOKENS)
    def append(self, sid, toks):
        if self.a.blocks_needed(sid, len(toks)) > self.a.num_free:
            used = self.a.num_used
            with pytest.raises(OutOfBlocks):
                self.a.append(sid, toks)
            assert self.a.num_used == used
            return
        before = self.a.seq_len(sid)
        app = self.a.append(sid, toks)
        assert app.start == before and len(app.slots) == len(toks) - app.cached
        assert app.cached == 0 or before == 0
        self.tokens.setdefault(sid, []).extend(toks)
        self.tables[sid] = self.a.block_table(sid)
        self.a.mark_computed(sid)

    @rule(sid=st.integers(0, 7))
    def free(self, sid):
        self.a.free(sid)
        self.tokens.pop(sid, None)
        self.tables.pop(sid, None)

    @invariant()
    def no_block_owned_twice_unless_shared_prefix(self):
        owner: dict[int, tuple[int, int]] = {}
        for sid in self.tokens:
            assert sid in self.a
            table = self.a.block_table(sid)
            assert len(table) == -(-len(self.tokens[sid]) // 3)
            assert self.a.seq_len(sid) == len(self.tokens[sid])
            for i, b in enumerate(table):
                if b in owner:
                    other, j = owner[b]
                    # only a full block at the same index with the same whole prefix may be shared
                    assert self.a.prefix_reuse and i == j
                    assert self.tokens[sid][:3 * (i + 1)] == self.tokens[other][:3 * (i + 1)]
                    assert len(self.tokens[sid]) > 3 * i + 2 and len(self.tokens[other]) > 3 * i + 2
                owner[b] = (sid, i)
        held = len(owner)
        assert self.a.num_used == held
        assert self.a.num_free == 12 - held

    @invariant()
    def held_blocks_stay_with_their_sequence(self):
        """Until it is freed, a sequence keeps every block it was given (a pending request's KV)."""
        for sid, table in self.tables.items():
            assert self.a.block_table(sid)[:len(table)] == table

    def teardown(self):
        for sid in list(self.tokens):
            self.a.free(sid)
        assert self.a.num_used == 0 and self.a.num_free == 12


class PlainMachine(AllocatorMachine):
    def __init__(self):
        super().__init__(prefix_reuse=False)


class ReuseMachine(AllocatorMachine):
    def __init__(self):
        super().__init__(prefix_reuse=True)


TestPlain = PlainMachine.TestCase
TestPlain.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestReuse = ReuseMachine.TestCase
TestReuse.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_bad_geometry_is_an_error():
    with pytest.raises(ValueError):
        BlockAllocator(0, 2)


def test_prefix_match_needs_the_whole_prefix_not_just_the_block():
    a = BlockAllocator(16, 2, prefix_reuse=True)
    a.append("a", [1, 2, 3, 4, 5])
    a.mark_computed("a")
    b = a.append("b", [9, 9, 3, 4, 5])  # same second block, different first: no sharing
    assert b.cached == 0
    c = a.append("c", [1, 2, 3, 4, 7])
    assert c.cached == 4 and a.block_table("c")[:2] == a.block_table("a")[:2]
    d = a.append("d", [1, 2, 3, 4])  # fully cached prompt: the last block is recomputed
    assert d.cached == 2
