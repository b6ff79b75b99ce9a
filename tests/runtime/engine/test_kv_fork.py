"""Forking a sequence's KV (`n` > 1 choices share their prompt): the allocator's reference
counts (hypothesis: random fork / append / free never leak a block, never free a block
still referenced, and never let a sequence write a block another references), and the
engine's KV after random forks, appends and frees, against a fresh prefill of each
sequence's tokens (a shared block is never corrupted)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tokenrouter.runtime.engine.block_allocator import BlockAllocator, OutOfBlocks
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions

BLOCKS, BS = 14, 3
SEQS = st.integers(0, 6)


class ForkMachine(RuleBasedStateMachine):
    """What each sequence holds (its tokens), checked against the allocator after every op."""

    def __init__(self, prefix_reuse: bool):
        super().__init__()
        self.a = BlockAllocator(BLOCKS, BS, prefix_reuse=prefix_reuse)
        self.tokens: dict[int, list[int]] = {}
        self.writable: dict[int, set[int]] = {}  # blocks each sequence may still write

    @rule(sid=SEQS, toks=st.lists(st.integers(0, 3), min_size=1, max_size=8))
    def append(self, sid, toks):
        if self.a.blocks_needed(sid, len(toks)) > self.a.num_free:
            with pytest.raises(OutOfBlocks):
                self.a.append(sid, toks)
            return
        had = self.tokens.get(sid, [])
        app = self.a.append(sid, toks)
        table = self.a.block_table(sid)
        for slot in app.slots:  # every block written is this sequence's alone
            assert self.a.ref_count(slot // BS) == 1 and slot // BS in table
        self.tokens[sid] = had + toks
        self.a.mark_computed(sid)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), child=SEQS)
    def fork(self, data, child):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        n = data.draw(st.integers(0, len(self.tokens[parent])))
        if child in self.tokens:
            with pytest.raises(KeyError):
                self.a.fork(parent, child, n)
            return
        free, copies = self.a.num_free, n % BS != 0
        if copies and free == 0:
            with pytest.raises(OutOfBlocks):
                self.a.fork(parent, child, n)
            assert child not in self.a
            return
        f = self.a.fork(parent, child, n)
        assert self.a.num_free == free - copies
        pt, ct = self.a.block_table(parent), self.a.block_table(child)
        assert ct[:n // BS] == pt[:n // BS]
        assert (f.copy is None) == (not copies)
        if copies:
            assert f.copy == (pt[n // BS], ct[-1]) and self.a.ref_count(ct[-1]) == 1
        assert self.a.seq_len(child) == n
        self.tokens[child] = list(self.tokens[parent][:n])

    @rule(sid=st.integers(0, 8))
    def free(self, sid):
        self.a.free(sid)
        self.tokens.pop(sid, None)

    @invariant()
    def reference_counts_are_the_tables(self):
        refs: dict[int, int] = {}
        for sid, toks in self.tokens.items():
            table = self.a.block_table(sid)
            assert len(table) == -(-len(toks) // BS) and self.a.seq_len(sid) == len(toks)
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        for b in range(BLOCKS):
            assert self.a.ref_count(b) == refs.get(b, 0)
        assert self.a.num_free == BLOCKS - len(refs)  # a block is free exactly at count zero

    @invariant()
    def a_shared_block_is_full_and_holds_the_same_tokens(self):
        seen: dict[int, tuple[int, int]] = {}
        for sid, toks in self.tokens.items():
            for i, b in enumerate(self.a.block_table(sid)):
                if b in seen:
                    other, j = seen[b]
                    assert i == j and len(toks) >= BS * (i + 1) and len(self.tokens[other]) >= BS * (i + 1)
                    assert toks[:BS * (i + 1)] == self.tokens[other][:BS * (i + 1)]
                seen[b] = (sid, i)

    def teardown(self):
        for sid in list(self.tokens):
            self.a.free(sid)
        assert self.a.num_free == BLOCKS and all(self.a.ref_count(b) == 0 for b in range(BLOCKS))


class PlainForks(ForkMachine):
    def __init__(self):
        super().__init__(prefix_reuse=False)


class ReuseForks(ForkMachine):
    def __init__(self):
        super().__init__(prefix_reuse=True)


TestPlainForks = PlainForks.TestCase
TestPlainForks.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestReuseForks = ReuseForks.TestCase
TestReuseForks.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_fork_refuses_what_it_cannot_do_and_changes_nothing():
    a = BlockAllocator(3, 4)
    a.append("p", list(range(10)))  # 3 blocks: 4 + 4 + 2
    with pytest.raises(KeyError, match="no such sequence"):
        a.fork("x", "c", 1)
    with pytest.raises(ValueError, match="holds 10"):
        a.fork("p", "c", 11)
    with pytest.raises(OutOfBlocks):  # 9 tokens: a partial block to copy, none free
        a.fork("p", "c", 9)
    assert "c" not in a and a.num_free == 0
    assert a.fork("p", "c", 8).copy is None  # a block boundary: nothing to copy
    with pytest.raises(KeyError, match="exists"):
        a.fork("p", "c", 4)
    a.free("p")
    assert a.num_free == 1  # p's last block; the two it shares with c stay
    a.free("c")
    assert a.num_free == 3


# ------------------------------------------------------------------ the engine's KV

OPS = st.lists(st.tuples(st.sampled_from(["fork", "append", "free"]), st.integers(0, 3), st.integers(0, 3),
                         st.lists(st.integers(1, 60), min_size=1, max_size=6)), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def llama_engines(tiny):
    _, cfg, sd = tiny("llama")
    return cfg, sd


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(1, 60), min_size=1, max_size=11), ops=OPS)
def test_forked_kv_equals_a_fresh_prefill_after_any_ops(llama_engines, prompt, ops):
    """Random forks (of any prefix), appends and frees: every append's logits equal those of
    a fresh prefill of the sequence's whole token list, so no write reached a block another
    sequence shares; at the end every block is free."""
    cfg, sd = llama_engines
    opts = EngineOptions(dtype=torch.float64, block_size=4, num_blocks=100)
    eng = Engine(cfg, sd, opts)
    fresh = Engine(cfg, sd, opts)
    eng.step([(0, prompt)])
    tokens = {0: list(prompt)}
    for n_op, (op, a, b, toks) in enumerate(ops):
        if op == "fork" and a in tokens and b not in tokens:
            n = len(tokens[a]) - (n_op % 3 if len(tokens[a]) > 2 else 0)
            eng.fork(a, b, n)
            tokens[b] = tokens[a][:n]
        elif op == "append" and a in tokens:
            out = eng.step([(a, toks)])
            tokens[a] = tokens[a] + toks
            ref = fresh.step([("ref", tokens[a])])
            fresh.free("ref")
            torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-9)
        elif op == "free":
            eng.free(a)
            tokens.pop(a, None)
        assert eng.blocks_used == len({blk for s in tokens for blk in eng.alloc.block_table(s)})
    for s in list(tokens):
        eng.free(s)
    assert eng.blocks_used == 0


def test_fork_copies_the_partial_block_and_shares_the_full_ones(llama_engines):
    cfg, sd = llama_engines
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=16))
    prompt = [5, 9, 14, 3, 7, 22, 8, 41, 2, 30]  # 2 full blocks of 4 and 2 tokens
    eng.step([("p", prompt)])
    assert eng.blocks_used == 3
    eng.fork("p", "c", len(prompt) - 1)  # the choices' fork: all but the prompt's last token
    assert eng.blocks_used == 4  # one copied block; the full two are shared
    pt, ct = eng.alloc.block_table("p"), eng.alloc.block_table("c")
    assert ct[:2] == pt[:2] and ct[2] != pt[2]
    assert all(eng.alloc.ref_count(b) == 2 for b in pt[:2])
    torch.testing.assert_close(eng.kv.kv[:, :, ct[2], :1], eng.kv.kv[:, :, pt[2], :1], rtol=0, atol=0)
    # both go on from there: their last prompt token, then different tokens
    out_p = eng.step([("p", [11])])
    out_c = eng.step([("c", [prompt[-1]])])
    fresh = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=16))
    torch.testing.assert_close(out_c.logits, fresh.step([("r", prompt)]).logits, rtol=0, atol=1e-9)
    torch.testing.assert_close(out_p.logits, fresh.step([("s", prompt + [11])]).logits, rtol=0, atol=1e-9)
    eng.free("p")
    assert eng.blocks_used == 3 and all(eng.alloc.ref_count(b) == 1 for b in pt[:2])
    eng.free("c")
    assert eng.blocks_used == 0
