"""One subserver per writer: its engine(s), its compiled router, its scheduler, two loops.

The *messaging loop* (a `sockets.Receiver` thread, `links.py`) only parses frames and queues them
(`inbox.py`). The *decoding loop* (`Subserver.serve`, the main thread of the process)
applies queued messages between steps, asks the scheduler for a batch, and runs one step
(`step.py`: feed, forward, combine, sample, route, commit), then tells the others:

    kept tokens stream to the frontend (`tokens`), ended requests are reported (`done`),
    departing requests go to their next writer through the compiled `send` (only what
    that writer has not read, invariant 2); here they turn `pending`.

What a departing request leaves behind and how handoffs travel are `policies.py`: pending
with its KV and peer to peer here; `rematch` and `relay` for the baselines.

Faults stay inside a request: a frame that fails validation is dropped and counted
(`frames_dropped{reason}`), a message whose handling raises fails only its request, a step
that raises fails that step's requests; the loops keep running. A heartbeat thread tells the
frontend this process is alive (`links.py`) and how far the decoding loop got (`progress.py`).
The launcher starts a subserver as a thread or a process (`process.py`). How a handoff
addresses its peer and what a peer's death means here are `peers.py`. A handoff or resume
older than what is known here of its request (`hops`) is dropped and counted as `stale`.
"""

from __future__ import annotations

import collections
import logging
import os
import time
import traceback
from typing import Any, Callable

import torch

from tokenrouter.protocol.state import PeerMessage, RouteState
from tokenrouter.runtime.cores import CoreShare, LedgerSpec
from tokenrouter.runtime.engine.grammar import Grammars
from tokenrouter.runtime.loader import program_tokenizer
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.subserver.inbox import Inbox
from tokenrouter.runtime.subserver.links import Links
from tokenrouter.runtime.metrics import PHASES, SubserverStats
from tokenrouter.runtime.subserver.policies import retention_policy, transport_policy
from tokenrouter.runtime.subserver.peers import Peers
from tokenrouter.runtime.subserver.progress import Progress, hold
from tokenrouter.runtime.subserver.forks import Forks
from tokenrouter.runtime.subserver.request import Request, unfit
from tokenrouter.runtime.subserver.scheduler import Scheduler
from tokenrouter.runtime.subserver.step import LOOP_ERROR, StepRunner
from tokenrouter.runtime.subserver.setup import LoadedWriter, SubserverSpec, writer_loader
from tokenrouter.runtime.transport.wire import FRONTEND

__all__ = ["Subserver", "SubserverSpec"]

log = logging.getLogger(__name__)

_TOMBSTONES = 65536  # released request ids remembered, to drop handoffs still in flight


class Subserver:
    """`load` loads the writer (default: its engine's, `setup.writer_loader`)."""

    def __init__(self, spec: SubserverSpec, ctx=None, models: dict[str, Any] | None = None,
                 load: Callable[..., LoadedWriter] | None = None):
        self.spec = spec
        self.writer = spec.writer
        if spec.set_threads and spec.threads > 0:
            torch.set_num_threads(spec.threads)
        # the host's cores, shared by need with the other writers here (`runtime/cores.py`)
        self.cores = CoreShare(LedgerSpec(**spec.cores)) if spec.cores and spec.set_threads else None
        phase_s = {p: 0.0 for p in PHASES}
        w = (load or writer_loader(spec))(spec, phase_s, models)
        self.program, self.members, self.router, self.engine = w.program, w.members, w.router, w.engine
        if self.cores is not None:
            self.engine.between_layers(self.cores.threads_now)  # a share that changes mid-step
        self.writers = self.program.writers()
        self.index = self.writers.index(self.writer)
        self.vocab_size = self.engine.vocab_size

        self.sched = Scheduler(spec.batch_threshold, int(spec.max_wait_ms * 1e6), spec.max_batch)
        self.stats = SubserverStats(self.writer, threads=torch.get_num_threads(),
                                    batch_threshold=spec.batch_threshold,
                                    max_wait_s=spec.max_wait_ms / 1000, phase_s=phase_s)
        self.runner = StepRunner(self.writer, self.writers, self.engine, phase_s,
                                 Grammars(load=lambda: program_tokenizer(self.program)))
        self.max_model_len = self.runner.max_model_len
        self.retention = retention_policy(spec.retention, self.engine, self._new_seq)
        self.transport = transport_policy(spec.transport)
        self.reqs: dict[str, Request] = {}
        self.forks = Forks(self.engine)  # the choices of one prompt prefill it once
        self._seq_counter = 0
        self._tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.incarnation = wire.new_incarnation()
        self.inbox = Inbox(self.writer, self.incarnation, spec.test_hooks, self._answer_stats, self._dropped)
        self.peers = Peers(self.writer, self.program, self.router)
        self._stop = False
        self.progress = Progress()  # what the heartbeat tells of the decoding loop

        self.links = Links(spec, self.transport.peers(self.writer, spec.addresses), ctx)
        self.out = self.links.out  # decoding loop only

    # ----------------------------------------------------------------- life
    def ready_message(self, error: str | None = None) -> wire.Ready:
        return wire.Ready(writer=self.writer, pid=os.getpid(), inc=self.incarnation, block_size=self.engine.block_size,
                          blocks_total=self.engine.blocks_total, max_model_len=self.max_model_len, vocab_size=self.vocab_size,
                          threads=self.stats.threads, batch_threshold=self.spec.batch_threshold,
                          max_wait_ms=self.spec.max_wait_ms, error=error)

    def serve(self) -> None:
        """Run until a shutdown message arrives."""
        self.links.listen(self.inbox.on_frame, on_refused=lambda: self._dropped("unauthenticated"))
        self.out.send(FRONTEND, wire.encode(self.ready_message()))
        self.progress.attach()
        self.links.start_heartbeat(lambda: wire.encode(self.progress.heartbeat(self.writer, os.getpid(),
                                                                               self.incarnation)))
        try:
            self._decode_loop()
        finally:
            self.links.close()

    def _dropped(self, reason: str) -> None:
        self.stats.frames_dropped[reason] = self.stats.frames_dropped.get(reason, 0) + 1

    def _answer_stats(self, msg: wire.Stats) -> None:  # messaging loop
        reply = wire.StatsReply(id=msg.id, writer=self.writer, inc=self.incarnation, stats=self.snapshot())
        self.links.reply.send(FRONTEND, wire.encode(reply))

    def snapshot(self) -> dict[str, Any]:
        used, total = self.engine.kv_usage()
        return self.stats.snapshot(blocks_used=used, blocks_free=total - used, engine_computed_tokens=self.engine.computed_tokens,
                                   kv_forks=self.forks.forked,
                                   pending=self.sched.count("pending"), ready=len(self.sched.ready()), requests=len(self.reqs))

    # -------------------------------------------------------- decoding loop
    def _decode_loop(self) -> None:
        while True:
            self.progress.turn()
            msgs = self.inbox.take()
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
            with self.progress.waiting():
                self.inbox.wait(None if d.wait_until is None else max(0.0, (d.wait_until - time.monotonic_ns()) / 1e9))

    # ------------------------------------------------------------ messages
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
            if self.peers.fenced(m.sender, m.inc):
                self._dropped("stale")  # sent by a process the frontend declared dead
                return
            self._receive(m.msg, m.sender, m.refill)
        elif isinstance(m, wire.Resume):
            self._receive(m.msg, FRONTEND, True)
        elif isinstance(m, wire.PeerDown):
            self._peer_down(m)
        elif isinstance(m, wire.Peers):
            self._peers(m.incarnations)
        elif isinstance(m, wire.Announce):
            if m.rid not in self._tombstones:
                self.sched.announce(m.rid)
        elif isinstance(m, wire.Release):
            self._release(m.rid)
        elif isinstance(m, wire.Shutdown):
            self._stop = True
            self.inbox.close()
        elif isinstance(m, wire.Configure):
            if m.batch_threshold is not None:
                self.sched.batch_threshold = self.stats.batch_threshold = m.batch_threshold
            if m.max_wait_ms is not None:
                self.sched.max_wait_ns = int(m.max_wait_ms * 1e6)
                self.stats.max_wait_s = m.max_wait_ms / 1000
        elif isinstance(m, wire.DebugFail):
            self.runner.fail_next += m.count
        elif isinstance(m, wire.DebugHold):
            hold(m.seconds, m.busy)

    def _new_seq(self) -> int:
        self._seq_counter += 1
        return self._seq_counter

    def _submit(self, m: wire.Submit) -> None:
        if m.rid in self._tombstones or m.rid in self.reqs:
            return
        why = unfit(m.prompt, self.max_model_len, self.vocab_size)
        if why:
            self._fail(m.rid, f"{self.writer}: submit refused: {why}")
            return
        # the route state carries the sampling parameters to the peers
        st = RouteState(rid=m.rid, tokens=list(m.prompt), prompt_len=len(m.prompt),
                        writer=self.writer, route_seed=m.route_seed, sampling=m.sampling)
        r = self.reqs[m.rid] = Request(st, self._new_seq(), m.sampling)
        if self.forks.arrive(r, self.reqs.get(m.fork_of) if m.fork_of else None):
            self.sched.announce(m.rid)  # ready once its parent's prompt KV is there (`forks.py`)
        else:
            self.sched.add(m.rid, time.monotonic_ns())

    def _receive(self, msg: PeerMessage, sender: str, refill: bool = False) -> None:
        """A request arrives from `sender` (a peer's handoff, or the frontend's resume): new
        here, or back with what this writer has not read. `refill`: its KV here was lost
        with a dead incarnation of this writer, so this is a re-prefill (counted)."""
        rid = msg.rid
        if rid in self._tombstones:
            return  # the request ended while this message was on its way
        r = self.reqs.get(rid)
        if r is not None and msg.hops <= r.state.hops:
            self._dropped("stale")  # a copy older than the one here (a resume raced a handoff)
            return
        if sender != FRONTEND:
            self.stats.handoffs_in[sender] = self.stats.handoffs_in.get(sender, 0) + 1
        self.stats.suffix_tokens_in += len(msg.suffix)
        try:
            st = self.router.receive(msg, r.state if r else None)
        except Exception as exc:
            self._fail(rid, f"{self.writer}: bad handoff from {sender}: {exc}")
            return
        why = unfit(st.tokens, self.max_model_len, self.vocab_size)
        if why:
            self._fail(rid, f"{self.writer}: bad handoff from {sender}: {why}")
            return
        if r is None:
            if refill:
                self.stats.reprefills += 1
                self.stats.reprefill_tokens += len(st.tokens)
            t0 = time.perf_counter()
            seq = self.retention.arrive(rid, st.tokens)
            self.stats.phase_s["bookkeeping"] += time.perf_counter() - t0
            r = self.reqs[rid] = Request(st, seq, st.sampling)
            self.sched.add(rid, time.monotonic_ns())
        else:
            r.state = st
            self.sched.returned(rid, time.monotonic_ns())

    def _peer_down(self, m: wire.PeerDown) -> None:
        """A peer's incarnation is dead (`Peers.down`): tell the frontend what is here."""
        entries = self.peers.down(m, self.reqs, self.sched.state)
        self.out.send(FRONTEND, wire.encode(wire.Census(writer=self.writer, inc=self.incarnation, round=m.round,
                                                        entries=entries)))

    def _peers(self, incarnations: dict[str, int]) -> None:
        """The peers' live incarnations: send what waited for a peer that is up now."""
        for rid in self.peers.up(incarnations, self.reqs):
            self.peers.unpark(rid)
            r = self.reqs[rid]
            self._send(r, r.state.writer)

    def _release(self, rid: str) -> None:
        self.peers.forget(rid)
        self._tombstones[rid] = None
        if len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)
        r = self.reqs.pop(rid, None)
        t0 = time.perf_counter()
        if r is not None:
            self.engine.release(r)
        self.retention.release(rid)
        self.sched.remove(rid)
        for c in self.forks.release(rid):
            self.sched.add(c.rid, time.monotonic_ns())
        self.stats.phase_s["bookkeeping"] += time.perf_counter() - t0

    def _fail(self, rid: str, message: str) -> None:
        """End a request with an error; the frontend's release frees it everywhere."""
        r = self.reqs.get(rid)
        if r is not None:
            self.engine.park(r)
        self.stats.requests_finished["error"] = self.stats.requests_finished.get("error", 0) + 1
        self.out.send(FRONTEND, wire.encode(wire.Done(writer=self.writer, inc=self.incarnation, rid=rid,
                                                      reason="error", n_out=r.n_out if r else 0,
                                                      written_by=dict(r.state.written_by) if r else {},
                                                      error=message)))
        if rid in self.sched:
            self.sched.depart(rid)
        elif r is None:
            self.sched.announce(rid)

    # ---------------------------------------------------------------- step
    def _step(self, rids: list[str]) -> None:
        t_start = time.perf_counter()
        now = time.monotonic_ns()
        if self.cores is None:
            res = self.runner.run([self.reqs[rid] for rid in rids])
        else:
            with self.cores.stepping() as threads:
                res = self.runner.run([self.reqs[rid] for rid in rids])
            self.stats.threads = threads
        for r in res.looped:  # a rewrite came straight back: the program would loop forever
            self._fail(r.rid, f"{self.writer}: {LOOP_ERROR}")
        for r, why in res.failed:
            self._fail(r.rid, why)
        if not res.stepped:
            return
        for r in res.stepped:
            self.stats.queue_wait_s.observe((now - self.sched.ready_since(r.rid)) / 1e9)
        self.stats.prefill_tokens += res.fed_tokens
        self.stats.prefill_tokens_computed += res.prompt_tokens
        for c in self.forks.stepped(res.stepped, ok=res.error is None):
            self.sched.add(c.rid, time.monotonic_ns())
        if res.error is not None:
            exc = res.error
            log.error("%s: step failed:\n%s", self.writer,
                      "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            for r in res.stepped:
                self._fail(r.rid, f"{type(exc).__name__}: {exc}")
        else:
            try:
                self._commit(res)
            except Exception as exc:
                log.error("%s: commit failed:\n%s", self.writer, traceback.format_exc())
                for r in res.stepped:
                    if r.rid in self.reqs and not r.state.finished:
                        self._fail_safely(r.rid, f"{type(exc).__name__}: {exc}")
        self.stats.steps += 1
        key = str(self.stats.threads)
        self.stats.step_threads[key] = self.stats.step_threads.get(key, 0) + 1
        self.stats.batch_size.observe(len(res.stepped))
        self.stats.step_s.observe(time.perf_counter() - t_start)

    def _commit(self, res) -> None:
        """Tell the frontend and the peers what the step did."""
        t0 = time.perf_counter()
        self.stats.tokens_written += len(res.committed)
        self.stats.tokens_rewritten += res.rewritten
        self.sched.stepped([r.rid for r in res.stayed], time.monotonic_ns())
        t1 = time.perf_counter()
        self.stats.phase_s["bookkeeping"] += t1 - t0
        for r, reason in res.ended:  # before the tokens: the frontend then ends a request with its last tokens
            r.state.finished = True
            self.stats.requests_finished[reason] = self.stats.requests_finished.get(reason, 0) + 1
            self.out.send(FRONTEND, wire.encode(wire.Done(writer=self.writer, inc=self.incarnation, rid=r.rid,
                                                          reason=reason, n_out=r.n_out,
                                                          written_by=dict(r.state.written_by))))
            self.sched.depart(r.rid)  # skipped until the frontend's release frees it everywhere
        if res.committed:  # a request's state names the writer of its next token by now
            events = [(r.rid, pos, tok, r.state.writer) for r, pos, tok in res.committed]
            self.out.send(FRONTEND, wire.encode(wire.Tokens(writer=self.writer, inc=self.incarnation, items=events,
                                                            logprobs=res.logprobs)))
        for r, dest in res.departing:
            self._send(r, dest)
        self.stats.phase_s["messaging"] += time.perf_counter() - t1

    def _send(self, r: Request, dest: str) -> None:
        rid = r.rid
        to = self.peers.live(dest)
        if not to:  # the peer is down (or not yet known): the request waits here for it
            self.peers.park(rid)
            self.sched.depart(rid)
            return
        self.retention.before_send(r.state, dest)
        try:
            msg = self.peers.message(r.state, dest)
        except Exception as exc:
            self._fail(rid, f"{self.writer}: cannot send to {dest}: {exc}")
            return
        self.stats.handoffs_out[dest] = self.stats.handoffs_out.get(dest, 0) + 1
        frame = wire.encode(wire.Handoff(sender=self.writer, inc=self.incarnation, to=to, dest=dest, msg=msg,
                                         refill=self.peers.take_refill(rid, dest)))
        self.out.send(self.transport.hop(dest), frame)
        if self.retention.keep(rid, r.seq, r.state.tokens[:self.runner.fed(r)]):
            self.sched.depart(rid)
        else:  # forgotten here, as by an independent server; it may still come back
            del self.reqs[rid]
            self.sched.remove(rid)
            self.sched.announce(rid)
