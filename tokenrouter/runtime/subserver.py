"""One subserver per writer: its engine(s), its compiled router, its scheduler, two loops.

The *messaging loop* (a `transport.Receiver` thread) only parses frames and queues them.
The *decoding loop* (`Subserver.serve`, the main thread of the process) applies queued
messages between steps, asks the scheduler for a batch, and runs one step:

    feed each request the tokens its KV lacks (prefill / extend / one-token decode)
    -> engine forward -> sample -> compiled `route` for the whole batch
    -> commit kept tokens (stream them to the frontend), end finished requests,
       send departing ones to their next writer (they turn `pending` here).

Invariant 1 (KV = fresh prefill of what the model has seen) holds by construction: a
request's KV length is the engine's `seq_len`, and every step feeds exactly
`tokens[seq_len:]`, appending to the blocks it already holds. Invariant 2: departing
requests go through the compiled `send`, which ships only what the peer has not read.

Faults stay inside a request: a frame that fails validation is dropped and counted
(`frames_dropped{reason}`), a message whose handling raises fails only its request, and a
step that raises fails the requests of that step; the loops keep running. A heartbeat
thread tells the frontend this process is alive (see `frontend.py`, liveness).

Two switches turn this into the baselines of the benchmarks (see `baselines/`):
`rematch` (no pending: a departing request's KV goes to a prefix cache and a returning
request is matched against it like a new one) and `relay` (handoffs go through the
frontend with the whole context, as a dispatcher between independent servers would).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

from tokenrouter.compiler.abi import FeatureNeeds, PeerMessage, RouteState, StepTensors
from tokenrouter.runtime import wire
from tokenrouter.runtime.metrics import SubserverStats
from tokenrouter.runtime.scheduler import Scheduler
from tokenrouter.runtime.transport import Receiver, Security, Sender, check_bind, stop_authenticator

log = logging.getLogger(__name__)

FRONTEND = "frontend"
_TOMBSTONES = 65536  # released request ids remembered, to drop handoffs still in flight
MAX_INBOX = 4096  # queued messages; beyond it the messaging loop stops reading (backpressure)
HEARTBEAT_S = 0.5


@dataclass
class SubserverSpec:
    """Everything a subserver process needs, JSON-safe (it crosses a spawn boundary)."""

    program_json: str
    writer: str
    addresses: dict[str, str]  # "frontend" and every writer's subserver
    base_dir: str | None = None  # where relative router files are found
    batch_threshold: int = 1
    max_wait_ms: float = 20.0
    threads: int = 0  # 0: leave torch's default
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_batch: int = 256
    rematch: bool = False
    relay: bool = False
    set_threads: bool = True  # False in thread mode: threads share one process
    test_hooks: bool = False  # accept test-only messages (debug_fail); tests only
    curve_keys: str | None = None  # folder of the CURVE key pair (tcp between hosts)
    insecure_tcp: bool = False  # allow plain tcp on a non-loopback address

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepFailure(RuntimeError):
    """Raised by the debug hook to prove failures end requests with an error."""


@dataclass
class _Req:
    state: RouteState
    seq: int  # engine sequence id
    params: Any  # the sampler's SamplingParams
    max_tokens: int
    stop: frozenset[int]


class Subserver:
    def __init__(self, spec: SubserverSpec, ctx=None, models: dict[str, Any] | None = None):
        import torch
        import zmq

        from tokenrouter.compiler import ir
        from tokenrouter.runtime.engine.engine import Engine
        from tokenrouter.runtime.engine.sampler import SamplingParams, sample

        self.spec = spec
        self.writer = spec.writer
        if spec.set_threads and spec.threads > 0:
            torch.set_num_threads(spec.threads)
        self._torch = torch
        self._SamplingParams, self._sample = SamplingParams, sample
        self.program = ir.Program.from_json(spec.program_json)
        self.writers = self.program.writers()
        self.index = self.writers.index(self.writer)
        ens = next((e for e in self.program.ensembles if e.name == self.writer), None)
        self.members = ens.members if ens else (self.writer,)
        self.ensemble = ens is not None
        self._model_names = {m.name for m in self.program.models}
        self._ensemble_members = {e.name: e.members for e in self.program.ensembles}

        from tokenrouter.compiler.compiled import load_routers
        from tokenrouter.runtime.loader import load_model, quant_kwargs

        dtype = getattr(torch, self.program.model(self.members[0]).dtype)
        self.router = load_routers(self.program, device=spec.device, dtype=dtype,
                                   base_dir=spec.base_dir)[self.writer]
        self.needs: FeatureNeeds = self.router.needs
        self.engines = {}
        for name in self.members:
            mdt = getattr(torch, self.program.model(name).dtype)
            pm = self.program.model(name)
            m = (models or {}).get(name) or load_model(pm.path, dtype=mdt, quant=pm.quant)
            kw = {"device": spec.device, "dtype": mdt, "block_size": spec.block_size, **quant_kwargs(m, pm.quant)}
            if spec.num_blocks is not None:
                kw["num_blocks"] = spec.num_blocks
            if spec.max_model_len is not None:
                kw["max_model_len"] = spec.max_model_len
            self.engines[name] = Engine(m.config, m.weights, **kw)
        first = self.engines[self.members[0]]
        self.max_model_len = min(e.max_model_len for e in self.engines.values())
        self.vocab_size = next(iter(self.engines.values())).config.vocab_size

        self.sched = Scheduler(spec.batch_threshold, int(spec.max_wait_ms * 1e6), spec.max_batch)
        self.stats = SubserverStats(self.writer, threads=torch.get_num_threads(),
                                    batch_threshold=spec.batch_threshold,
                                    max_wait_s=spec.max_wait_ms / 1000)
        self.reqs: dict[str, _Req] = {}
        self._seq_counter = 0
        self._tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._prefix_cache: dict[tuple[int, ...], tuple[int, str]] = {}  # rematch mode
        self._inbox: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._fail_steps = 0
        self._block_size = first.block_size

        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self.security = Security.load(spec.curve_keys, spec.insecure_tcp)
        check_bind(spec.addresses[self.writer], self.security)  # before `ready`: a clear start-up error
        # relay mode (independent servers): no sockets to peers, only to the dispatcher
        peers = {n: a for n, a in spec.addresses.items()
                 if n != self.writer and (n == FRONTEND or not spec.relay)}
        sec = self.security
        self.out = Sender(self._ctx, peers, sec)  # used by the decoding loop only
        self._reply = Sender(self._ctx, {FRONTEND: spec.addresses[FRONTEND]}, sec)  # messaging loop only
        self._beat = Sender(self._ctx, {FRONTEND: spec.addresses[FRONTEND]}, sec)  # heartbeat thread only
        self._beating = threading.Event()

    # ----------------------------------------------------------------- life
    def ready_message(self, error: str | None = None) -> wire.Ready:
        return wire.Ready(writer=self.writer, pid=os.getpid(), block_size=self._block_size,
                          blocks_total=min(e.blocks_total for e in self.engines.values()),
                          max_model_len=self.max_model_len, vocab_size=self.vocab_size,
                          threads=self.stats.threads, batch_threshold=self.spec.batch_threshold,
                          max_wait_ms=self.spec.max_wait_ms, error=error)

    def serve(self) -> None:
        """Run until a shutdown message arrives."""
        self.receiver = Receiver(self._ctx, self.spec.addresses[self.writer], self._on_frame,
                                 name=f"msg-{self.writer}", security=self.security)
        self.out.send(FRONTEND, wire.encode(self.ready_message()))
        beat = threading.Thread(target=self._heartbeat, name=f"beat-{self.writer}", daemon=True)
        beat.start()
        try:
            self._decode_loop()
        finally:
            self._beating.set()
            beat.join(5)
            self.receiver.stop()
            self.out.close()
            self._reply.close()
            self._beat.close()
            if self._own_ctx:
                stop_authenticator(self._ctx)
                self._ctx.term()

    def _heartbeat(self) -> None:
        frame = wire.encode(wire.Heartbeat(writer=self.writer, pid=os.getpid()))
        while not self._beating.wait(HEARTBEAT_S):
            self._beat.send(FRONTEND, frame)

    def _dropped(self, reason: str) -> None:
        d = self.stats.frames_dropped
        d[reason] = d.get(reason, 0) + 1

    # ------------------------------------------------------- messaging loop
    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            log.warning("%s: dropped a frame: %s", self.writer, exc)
            self._dropped("invalid")
            return
        if msg.t in wire.TEST_ONLY and not self.spec.test_hooks:
            log.warning("%s: refused a test-only %r message (test hooks are off)", self.writer, msg.t)
            self._dropped("test_only")
            return
        if isinstance(msg, wire.Stats):  # answered here, without waiting for a step
            self._reply.send(FRONTEND, wire.encode(wire.StatsReply(
                id=msg.id, writer=self.writer, stats=self.snapshot())))
            return
        with self._cv:
            while len(self._inbox) >= MAX_INBOX and not self._stop:  # bounded: push back
                self._cv.wait(0.1)
            self._inbox.append(msg)
            self._cv.notify_all()

    def snapshot(self) -> dict[str, Any]:
        used = sum(e.blocks_used for e in self.engines.values())
        total = sum(e.blocks_total for e in self.engines.values())
        return self.stats.snapshot(blocks_used=used, blocks_free=total - used,
                                   pending=self.sched.count("pending"),
                                   ready=len(self.sched.ready()), requests=len(self.reqs))

    # -------------------------------------------------------- decoding loop
    def _decode_loop(self) -> None:
        while True:
            with self._cv:
                msgs = list(self._inbox)
                self._inbox.clear()
                self._cv.notify_all()  # room in the inbox again
            t0 = time.perf_counter()
            for m in msgs:
                self._apply_safely(m)
            self.stats.phase_s["messaging"] += time.perf_counter() - t0
            if self._stop:
                return
            t0 = time.perf_counter()
            d = self.sched.decide(time.monotonic_ns())
            self.stats.phase_s["schedule"] += time.perf_counter() - t0
            if d.batch:
                self.stats.launch_reasons[d.reason] = self.stats.launch_reasons.get(d.reason, 0) + 1
                batch = list(d.batch)
                try:
                    self._step(batch)
                except Exception as exc:  # a bug outside the step's own guard: same treatment
                    log.error("%s: step failed:\n%s", self.writer, traceback.format_exc())
                    for rid in batch:
                        if rid in self.reqs:
                            self._fail_safely(rid, f"{type(exc).__name__}: {exc}")
                continue
            with self._cv:
                if self._inbox:
                    continue
                timeout = None if d.wait_until is None else max(0.0, (d.wait_until - time.monotonic_ns()) / 1e9)
                self._cv.wait(timeout)

    def _apply_safely(self, m: wire.Message) -> None:
        """Apply one message; if that raises, fail only the request it was about."""
        try:
            self._apply(m)
        except Exception as exc:
            log.error("%s: could not apply a %r message:\n%s", self.writer, m.t, traceback.format_exc())
            self._dropped("error")
            rid = getattr(m, "rid", None) or getattr(getattr(m, "msg", None), "rid", None)
            if rid is not None and rid not in self._tombstones:
                self._fail_safely(rid, f"{self.writer}: cannot take the {m.t} message: {type(exc).__name__}: {exc}")

    def _fail_safely(self, rid: str, message: str) -> None:
        try:
            self._fail(rid, message)
        except Exception:
            log.exception("%s: could not fail request %s", self.writer, rid)

    def _apply(self, m: wire.Message) -> None:
        if isinstance(m, wire.Submit):
            self._submit(m)
        elif isinstance(m, wire.Handoff):
            self._receive(m)
        elif isinstance(m, wire.Announce):
            if m.rid not in self._tombstones:
                self.sched.announce(m.rid)
        elif isinstance(m, wire.Release):
            self._release(m.rid)
        elif isinstance(m, wire.Shutdown):
            self._stop = True
        elif isinstance(m, wire.Configure):
            if m.batch_threshold is not None:
                self.sched.batch_threshold = self.stats.batch_threshold = m.batch_threshold
            if m.max_wait_ms is not None:
                self.sched.max_wait_ns = int(m.max_wait_ms * 1e6)
                self.stats.max_wait_s = m.max_wait_ms / 1000
        elif isinstance(m, wire.DebugFail):
            self._fail_steps += m.count

    def _new_seq(self) -> int:
        self._seq_counter += 1
        return self._seq_counter

    def _make_req(self, state: RouteState, seq: int) -> _Req:
        s = wire.Sampling.model_validate(state.sampling)  # typed and bounded (wire.py)
        params = self._SamplingParams(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
            max_tokens=s.max_tokens, stop_token_ids=tuple(s.stop_token_ids))
        return _Req(state, seq, params, s.max_tokens, frozenset(s.stop_token_ids))

    def _unfit(self, tokens: list[int]) -> str | None:
        """Why these tokens cannot run here (checked per request, so one bad request
        never fails a whole batch in the engine)."""
        if len(tokens) >= self.max_model_len:
            return f"{len(tokens)} tokens do not fit the context of {self.max_model_len}"
        bad = next((t for t in tokens if t >= self.vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})"
        return None

    def _submit(self, m: wire.Submit) -> None:
        if m.rid in self._tombstones or m.rid in self.reqs:
            return
        why = self._unfit(m.prompt)
        if why:
            self._fail(m.rid, f"{self.writer}: submit refused: {why}")
            return
        sampling = m.sampling.model_dump()
        st = RouteState(rid=m.rid, tokens=list(m.prompt), prompt_len=len(m.prompt),
                        writer=self.writer, seed=m.seed, sampling=sampling)
        self.reqs[m.rid] = self._make_req(st, self._new_seq())
        self.sched.add(m.rid, len(m.prompt), time.monotonic_ns())

    def _receive(self, m: wire.Handoff) -> None:
        rid = m.msg.rid
        if rid in self._tombstones:
            return  # the request ended while this message was on its way
        self.stats.handoffs_in[m.sender] = self.stats.handoffs_in.get(m.sender, 0) + 1
        self.stats.suffix_tokens_in += len(m.msg.suffix)
        r = self.reqs.get(rid)
        try:
            st = self.router.receive(m.msg, r.state if r else None)
        except Exception as exc:
            self._fail(rid, f"{self.writer}: bad handoff from {m.sender}: {exc}")
            return
        why = self._unfit(st.tokens)
        if why:
            self._fail(rid, f"{self.writer}: bad handoff from {m.sender}: {why}")
            return
        now = time.monotonic_ns()
        if r is None:
            seq = self._rematch(rid, st.tokens) if self.spec.rematch else self._new_seq()
            r = self.reqs[rid] = self._make_req(st, seq)
            fed = self._seq_len(r)
            self.sched.add(rid, len(st.tokens) - fed, now)
        else:
            r.state = st
            self.sched.returned(rid, len(st.tokens) - self._seq_len(r), now)

    def _release(self, rid: str) -> None:
        self._tombstones[rid] = None
        if len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)
        r = self.reqs.pop(rid, None)
        t0 = time.perf_counter()
        if r is not None:
            for e in self.engines.values():
                e.free(r.seq)
        if self._prefix_cache:
            for key, (seq, owner) in list(self._prefix_cache.items()):
                if owner == rid:
                    for e in self.engines.values():
                        e.free(seq)
                    del self._prefix_cache[key]
        self.sched.remove(rid)
        self.stats.phase_s["bookkeeping"] += time.perf_counter() - t0

    # ------------------------------------------------------------ rematch
    def _rematch(self, rid: str, tokens: list[int]) -> int:
        """Baseline only: find the longest cached sequence whose tokens prefix `tokens`
        (a fresh request's prefix match), take it over, or start a new sequence."""
        t0 = time.perf_counter()
        best = None
        for L in sorted({len(k) for k in self._prefix_cache}, reverse=True):
            if L < len(tokens):  # a step must feed at least one token
                key = tuple(tokens[:L])
                if key in self._prefix_cache:
                    best = key
                    break
        seq = self._prefix_cache.pop(best)[0] if best is not None else self._new_seq()
        for key, (other, owner) in list(self._prefix_cache.items()):
            if owner == rid:  # at most one sequence per request and engine
                for e in self.engines.values():
                    e.free(other)
                del self._prefix_cache[key]
        self.stats.phase_s["bookkeeping"] += time.perf_counter() - t0
        return seq

    def _park(self, rid: str, r: _Req) -> None:
        """Baseline only: a departing request leaves; its KV goes to the prefix cache."""
        fed = self._seq_len(r)
        key = tuple(r.state.tokens[:fed])
        old = self._prefix_cache.get(key)
        if old is not None and old[0] != r.seq:  # an identical context is cached: keep one
            for e in self.engines.values():
                e.free(old[0])
        self._prefix_cache[key] = (r.seq, rid)
        del self.reqs[rid]
        self.sched.remove(rid)
        self.sched.announce(rid)

    # ---------------------------------------------------------------- step
    def _seq_len(self, r: _Req) -> int:
        return self.engines[self.members[0]].seq_len(r.seq)

    def _step(self, rids: list[str]) -> None:
        torch = self._torch
        t_start = time.perf_counter()
        empty = [rid for rid in rids if self._seq_len(self.reqs[rid]) >= len(self.reqs[rid].state.tokens)]
        for rid in empty:  # a rewrite came straight back: the program would loop forever
            self._fail(rid, f"{self.writer}: request came back with no new token "
                            f"(two writers rewrite each other's token in a loop)")
        rids = [rid for rid in rids if rid not in empty]
        if not rids:
            return
        now = time.monotonic_ns()
        for rid in rids:
            self.stats.queue_wait_s.observe((now - self.sched.ready_since(rid)) / 1e9)
        try:
            if self._fail_steps > 0:
                self._fail_steps -= 1
                raise StepFailure(f"{self.writer}: injected step failure (debug_fail)")
            t0 = time.perf_counter()
            reqs = [self.reqs[rid] for rid in rids]
            items = [(r.seq, r.state.tokens[self._seq_len(r):]) for r in reqs]
            fits = all(e.can_append(items) for e in self.engines.values())
            self.stats.phase_s["bookkeeping"] += time.perf_counter() - t0
            if not fits:
                raise RuntimeError(f"{self.writer}: KV cache full for a batch of {len(items)}")
            self.stats.prefill_tokens += sum(len(t) for _, t in items)

            t0 = time.perf_counter()
            outs = [self.engines[m].step(items, self.needs) for m in self.members]
            t1 = time.perf_counter()
            self.stats.phase_s["forward"] += t1 - t0

            positions = torch.tensor([len(r.state.tokens) - r.state.prompt_len for r in reqs], dtype=torch.int64)
            visit = torch.tensor([r.state.visit_tokens + 1 for r in reqs], dtype=torch.int64)
            seeds = torch.tensor([r.state.seed for r in reqs], dtype=torch.int64)
            if self.ensemble:
                member_logits = tuple(o.logits for o in outs)
                probe = StepTensors(logits=None, sampled=None, visit_tokens=visit, position=positions,
                                    request_seed=seeds, member_logits=member_logits)
                logits = self.router.combine(probe)
            else:
                member_logits = ()
                logits = outs[0].logits
            sampled = self._sample(logits, [r.params for r in reqs], positions.tolist())
            t2 = time.perf_counter()
            self.stats.phase_s["sample"] += t2 - t1

            step = StepTensors(logits=None if self.ensemble else logits, sampled=sampled,
                               visit_tokens=visit, position=positions, request_seed=seeds,
                               hidden=dict(outs[0].hidden) if not self.ensemble else {},
                               member_logits=member_logits)
            if self.needs.token_embedding and not self.ensemble:
                step.token_embedding = self.engines[self.writer].embed(sampled)
            decisions = self.router.route(step).tolist()
            t3 = time.perf_counter()
            self.stats.phase_s["route"] += t3 - t2
        except Exception as exc:
            log.error("%s: step failed:\n%s", self.writer, traceback.format_exc())
            for rid in rids:
                self._fail(rid, f"{type(exc).__name__}: {exc}")
            self._record_step(len(rids), t_start)
            return
        try:
            self._commit(rids, reqs, sampled.tolist(), decisions)
        except Exception as exc:
            log.error("%s: commit failed:\n%s", self.writer, traceback.format_exc())
            for rid in rids:
                r = self.reqs.get(rid)
                if r is not None and not r.state.finished:
                    self._fail_safely(rid, f"{type(exc).__name__}: {exc}")
        self._record_step(len(rids), t_start)

    def _record_step(self, n: int, t_start: float) -> None:
        self.stats.steps += 1
        self.stats.batch_size.observe(n)
        self.stats.step_s.observe(time.perf_counter() - t_start)

    def _commit(self, rids, reqs, sampled, decisions) -> None:
        t0 = time.perf_counter()
        dests, keeps = decisions
        events: list[tuple[str, int, int]] = []
        stayed, departing, done = [], [], []
        for rid, r, tok, dest, keep in zip(rids, reqs, sampled, dests, keeps):
            st = r.state
            if keep:
                events.append((rid, len(st.tokens) - st.prompt_len, tok))
                st.tokens.append(tok)
                st.visit_tokens += 1
                st.written_by[self.writer] = st.written_by.get(self.writer, 0) + 1
                self.stats.tokens_written += 1
                n_out = len(st.tokens) - st.prompt_len
                if tok in r.stop:
                    done.append((rid, "stop"))
                    continue
                if n_out >= r.max_tokens or len(st.tokens) >= self.max_model_len:
                    done.append((rid, "length"))
                    continue
            else:
                self.stats.tokens_rewritten += 1
            if dest == self.index:
                stayed.append(rid)
            else:
                departing.append((rid, r, self.writers[dest]))
        self.sched.stepped(stayed, time.monotonic_ns())
        t1 = time.perf_counter()
        self.stats.phase_s["bookkeeping"] += t1 - t0
        if events:
            self.out.send(FRONTEND, wire.encode(wire.Tokens(writer=self.writer, items=events)))
        for rid, reason in done:
            r = self.reqs[rid]
            r.state.finished = True
            self.stats.requests_finished[reason] = self.stats.requests_finished.get(reason, 0) + 1
            self.out.send(FRONTEND, wire.encode(wire.Done(
                rid=rid, reason=reason, n_out=len(r.state.tokens) - r.state.prompt_len,
                written_by=dict(r.state.written_by))))
            self.sched.depart(rid)  # skipped until the frontend's release frees it everywhere
        for rid, r, dest in departing:
            self._send(rid, r, dest)
        self.stats.phase_s["messaging"] += time.perf_counter() - t1

    def _send(self, rid: str, r: _Req, dest: str) -> None:
        st = r.state
        st.writer, st.visit_tokens = dest, 0
        if self.spec.rematch:
            st.peer_read[dest] = 0  # the whole context travels, as to an independent server
        try:
            msg = self._compiled_send(st, dest)
        except Exception as exc:
            self._fail(rid, f"{self.writer}: cannot send to {dest}: {exc}")
            return
        self.stats.handoffs_out[dest] = self.stats.handoffs_out.get(dest, 0) + 1
        frame = wire.encode(wire.Handoff(sender=self.writer, dest=dest, msg=msg))
        self.out.send(FRONTEND if self.spec.relay else dest, frame)
        if self.spec.rematch:
            self._park(rid, r)
        else:
            self.sched.depart(rid)

    def _compiled_send(self, st: RouteState, dest: str) -> PeerMessage:
        """The compiled `send` addresses models; an ensemble writer is reached through one
        of its members' names, while `peer_read` stays keyed by the writer (as the
        compiled `receive` keys it by the message's sender)."""
        if dest in self._model_names:
            return self.router.send(st, dest)
        key = self._ensemble_members[dest][0]
        saved = st.peer_read.get(key)
        st.peer_read[key] = st.peer_read.get(dest, 0)
        try:
            msg = self.router.send(st, key)
            st.peer_read[dest] = st.peer_read[key]
        finally:
            if saved is None:
                st.peer_read.pop(key, None)
            else:
                st.peer_read[key] = saved
        return msg

    def _fail(self, rid: str, message: str) -> None:
        """End a request with an error; the frontend's release frees it everywhere."""
        r = self.reqs.get(rid)
        n_out = len(r.state.tokens) - r.state.prompt_len if r else 0
        wb = dict(r.state.written_by) if r else {}
        self.stats.requests_finished["error"] = self.stats.requests_finished.get("error", 0) + 1
        self.out.send(FRONTEND, wire.encode(wire.Done(rid=rid, reason="error", n_out=n_out,
                                                      written_by=wb, error=message)))
        if rid in self.sched:
            self.sched.depart(rid)
        elif r is None:
            self.sched.announce(rid)


def run_process(spec_dict: dict[str, Any]) -> None:
    """Entry point of a subserver process (multiprocessing target, spawn start method)."""
    logging.basicConfig(level=os.environ.get("TOKENROUTER_LOG", "WARNING"),
                        format=f"[{spec_dict.get('writer')}] %(levelname)s %(message)s")
    spec = SubserverSpec(**spec_dict)
    parent = os.getppid()

    def watch_parent() -> None:  # no orphans: end with the process that started us
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        sub = Subserver(spec)
    except Exception as exc:
        _report_startup_failure(spec, exc)
        return
    sub.serve()


def _report_startup_failure(spec: SubserverSpec, exc: BaseException, ctx=None) -> None:
    import zmq
    log.error("%s: start-up failed:\n%s", spec.writer, traceback.format_exc())
    c = ctx or zmq.Context()
    try:
        sec = Security.load(spec.curve_keys, spec.insecure_tcp)
    except ValueError:
        sec = None  # the failure may be the keys themselves: report it in the clear (tcp only)
    s = Sender(c, {FRONTEND: spec.addresses[FRONTEND]}, sec)
    s.send(FRONTEND, wire.encode(wire.Ready(
        writer=spec.writer, pid=os.getpid(), block_size=0, blocks_total=0, max_model_len=0,
        vocab_size=0, threads=0, batch_threshold=spec.batch_threshold,
        max_wait_ms=spec.max_wait_ms, error=f"{type(exc).__name__}: {exc}")))
    s.close()
    if ctx is None:
        c.term()
