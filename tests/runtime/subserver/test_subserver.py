"""Subservers driven directly over real sockets, the test playing the frontend.

The test relays every handoff itself (the `relay` transport), so it sees exactly what crosses the
wire (invariant 2), and it holds the subserver objects, so at the end it can compare each
model's KV cache for every request with a fresh prefill of the tokens that model has seen
(invariant 1), before releasing everything and checking the blocks come back (invariant 3).
"""

import threading

import pytest
import torch
import zmq

from tests.helpers import tiny
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.launch import LaunchOptions, plan
from tokenrouter.runtime.loader import load_model
from tokenrouter.runtime.reference import Reference
from tokenrouter.runtime.subserver.subserver import Subserver
from tokenrouter.runtime.transport.sockets import make_addresses

PROMPTS = [[5 + i, 40 + 3 * i, 77, 100 + i] * (1 + i % 3) for i in range(10)]
MAX_TOKENS = 14


def _kv(eng, seq):
    slots = []
    for b in eng.alloc.block_table(seq):
        slots += range(b * eng.block_size, (b + 1) * eng.block_size)
    slots = torch.tensor(slots[:eng.seq_len(seq)])
    return eng.kv.k[:, slots], eng.kv.v[:, slots]


@pytest.mark.parametrize("make", [lambda p: tiny.coin(p, 0.3), lambda p: tiny.rstitch(p, 0.25)],
                         ids=["coin", "rstitch"])
def test_pending_handoffs_send_suffixes_and_keep_kv_exact(pair, make):
    program = make(pair)
    names = ["frontend", "slm", "llm"]
    addrs = make_addresses(names, "inproc")
    specs = plan(program, LaunchOptions(mode="thread", addresses=addrs, transport="relay", num_blocks=96,
                                        batch={"llm": 3}, max_wait_ms={"llm": 5}))
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(addrs["frontend"])
    push = {}
    for w in ("slm", "llm"):
        push[w] = ctx.socket(zmq.PUSH)
        push[w].connect(addrs[w])
    subs = {w: Subserver(specs[w], ctx=ctx) for w in ("slm", "llm")}
    threads = [threading.Thread(target=s.serve, daemon=True) for s in subs.values()]
    for t in threads:
        t.start()
    try:
        ready = [wire.decode(pull.recv()) for _ in range(2)]
        assert {r.writer for r in ready} == {"slm", "llm"}
        inc = {r.writer: r.inc for r in ready}
        for w in push:
            push[w].send(wire.encode(wire.Peers(to=inc[w], incarnations=inc)))
        sampling = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "stop_token_ids": [tiny.EOS]}
        for i, p in enumerate(PROMPTS):
            push["llm"].send(wire.encode(wire.Announce(to=inc["llm"], rid=f"r{i}")))
            push["slm"].send(wire.encode(wire.Submit(to=inc["slm"], rid=f"r{i}", prompt=p, sampling=sampling)))
        # (rid, writer) -> how many tokens of the request that writer knows
        known: dict[tuple[str, str], int] = {(f"r{i}", "slm"): len(p) for i, p in enumerate(PROMPTS)}
        out: dict[str, dict[int, int]] = {f"r{i}": {} for i in range(len(PROMPTS))}
        done: dict[str, wire.Done] = {}
        handoffs = 0
        # a request's `done` comes before its last tokens
        while len(done) < len(PROMPTS) or any(len(out[r]) < d.n_out for r, d in done.items()):
            assert pull.poll(20000), "no progress: a request hangs"
            m = wire.decode(pull.recv())
            if isinstance(m, wire.Handoff):
                rid = m.msg.rid
                # invariant 2: the suffix starts exactly where the receiver stopped reading,
                # and ends with what the sender knows
                assert m.msg.start == known.get((rid, m.dest), 0)
                assert m.msg.start + len(m.msg.suffix) == known[(rid, m.sender)]
                assert m.msg.sender == m.sender and m.to == inc[m.dest] and m.inc == inc[m.sender]
                known[(rid, m.dest)] = m.msg.start + len(m.msg.suffix)
                handoffs += 1
                push[m.dest].send(wire.encode(m))
            elif isinstance(m, wire.Tokens):
                for rid, pos, tok, _ in m.items:
                    assert pos not in out[rid]
                    out[rid][pos] = tok
                    prompt_len = len(PROMPTS[int(rid[1:])])
                    assert known[(rid, m.writer)] == prompt_len + pos
                    known[(rid, m.writer)] = prompt_len + pos + 1
            elif isinstance(m, wire.Done):
                assert m.reason in ("stop", "length"), m.error
                done[m.rid] = m
        assert handoffs > 5  # the program really routed

        # the outputs are the reference's
        ref = Reference(program)
        for i, p in enumerate(PROMPTS):
            r = ref.generate(p, SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(tiny.EOS,)))
            got = [out[f"r{i}"][k] for k in range(len(out[f"r{i}"]))]
            assert got == r.tokens and done[f"r{i}"].written_by == r.written_by

        # invariant 1: every model's KV equals a fresh prefill of what it has seen
        import time
        time.sleep(0.2)  # let the loops go idle (nothing is ready any more)
        for w, sub in subs.items():
            eng = sub.engine.engines[w]
            m = load_model(program.model(w).path, dtype=torch.float64)
            fresh = Engine(m.config, m.weights, EngineOptions(dtype=torch.float64, num_blocks=16))
            for rid, r in sub.reqs.items():
                n = eng.seq_len(r.seq)
                assert len(r.state.tokens) - 1 <= n <= len(r.state.tokens)
                fresh.step([("x", r.state.tokens[:n])])
                k, v = _kv(eng, r.seq)
                fk, fv = _kv(fresh, "x")
                torch.testing.assert_close(k, fk, rtol=0, atol=1e-9)
                torch.testing.assert_close(v, fv, rtol=0, atol=1e-9)
                fresh.free("x")
            assert eng.blocks_used > 0

        # invariant 3: releasing every request frees every block
        for rid in done:
            for w in push:
                push[w].send(wire.encode(wire.Release(to=inc[w], rid=rid)))
        deadline = time.monotonic() + 5
        while any(s.engine.engines[w].blocks_used for w, s in subs.items()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(s.engine.engines[w].blocks_used == 0 for w, s in subs.items())
        assert all(not s.reqs and len(s.sched) == 0 for s in subs.values())
    finally:
        for w in push:
            push[w].send(wire.encode(wire.Shutdown(to=inc[w])))
        for t in threads:
            t.join(10)
        for s in push.values():
            s.close()
        pull.close()
        ctx.term()
