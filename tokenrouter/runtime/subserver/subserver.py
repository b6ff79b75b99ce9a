"""One subserver per writer: its engine(s), its compiled router, its scheduler, two loops.

The *messaging loop* (a `sockets.Receiver` thread) only parses frames and queues them
(`inbox.py`). The *decoding loop* (`Subserver.serve`, the main thread of the process)
applies queued messages between steps, asks the scheduler for a batch, and runs one step
(`step.py`: feed, forward, combine, sample, route, commit), then tells the others:

    kept tokens stream to the frontend (`tokens`), ended requests are reported (`done`),
    departing requests go to their next writer through the compiled `send` (only what
    that writer has not read, invariant 2); here they turn `pending`.

What a departing request leaves behind and how handoffs travel are `policies.py`: pending
with its KV and peer to peer here; `rematch` and `relay` for the baselines.

Faults stay inside a request: a frame that fails validation is dropped and counted
(`frames_dropped{reason}`), a message whose handling raises fails only its request, and a
step that raises fails the requests of that step; the loops keep running. A heartbeat
thread tells the frontend this process is alive (see `frontend/liveness.py`), while its
messaging loop runs.

When a peer's process dies, the frontend says so (`peer_down`, `_peer_down`): this
subserver then drops that incarnation's handoffs, forgets what the peer had read of each
request (the next handoff to its successor carries the whole context, `refill`), and
answers with a census of its requests, from which the frontend decides which requests were
lost with the peer (`frontend/recovery.py`); those come back as `resume` messages. A
request departing to a peer that is down waits here (parked) until the frontend's `peers`
says which incarnation is live; every handoff names it (`to`), so one sent to a dead
predecessor is dropped by its successor. A handoff or resume older than what is known here
of its request (`hops`) is dropped and counted as `stale`.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable

import torch
import zmq

from tokenrouter.protocol.state import PeerMessage, RouteState
from tokenrouter.runtime.engine.grammar import Grammars
from tokenrouter.runtime.loader import program_tokenizer
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.subserver.inbox import Inbox
from tokenrouter.runtime import logs
from tokenrouter.runtime.metrics import PHASES, SubserverStats
from tokenrouter.runtime.subserver.policies import retention_policy, transport_policy
from tokenrouter.runtime.subserver.memory import bound_heap_growth
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.subserver.scheduler import Scheduler
from tokenrouter.runtime.subserver.step import LOOP_ERROR, StepRunner
from tokenrouter.runtime.subserver.setup import LoadedWriter, SubserverSpec, load_writer, report_startup_failure
from tokenrouter.runtime.transport.security import Security, check_bind, stop_authenticator
from tokenrouter.runtime.transport.sockets import Receiver, Sender
from tokenrouter.runtime.transport.wire import FRONTEND

__all__ = ["Subserver", "SubserverSpec", "run_process", "run_thread"]

log = logging.getLogger(__name__)

_TOMBSTONES = 65536  # released request ids remembered, to drop handoffs still in flight
HEARTBEAT_S = 0.5


class Subserver:
    """`load` loads the writer (`setup.load_writer`: tokenrouter's engine; the launcher
    passes `runtime/vllm`'s for a writer served by vLLM)."""

    def __init__(self, spec: SubserverSpec, ctx=None, models: dict[str, Any] | None = None,
                 load: Callable[..., LoadedWriter] | None = None):
        self.spec = spec
        self.writer = spec.writer
        if spec.set_threads and spec.threads > 0:
            torch.set_num_threads(spec.threads)
        phase_s = {p: 0.0 for p in PHASES}
        w = (load or load_writer)(spec, phase_s, models)
        self.program, self.members, self.router, self.engine = w.program, w.members, w.router, w.engine
        self.writers = self.program.writers()
        self.index = self.writers.index(self.writer)
        self._model_names = {m.name for m in self.program.models}
        self._ensemble_members = {e.name: e.members for e in self.program.ensembles}
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
        self._seq_counter = 0
        self._tombstones: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.incarnation = wire.new_incarnation()
        self.inbox = Inbox(self.writer, self.incarnation, spec.test_hooks, self._answer_stats, self._dropped)
        self._fenced: set[tuple[str, int]] = set()  # (writer, incarnation) the frontend declared dead
        self._refill: set[tuple[str, str]] = set()  # (rid, peer): the peer lost the request's KV
        self._peer_inc: dict[str, int] = {}  # each peer's live incarnation (the frontend's `peers`)
        self._parked: set[str] = set()  # departed to a peer that is down: sent when it is up
        self._stop = False

        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self.security = Security.load(spec.curve_keys, spec.insecure_tcp, spec.curve_pair)
        check_bind(spec.addresses[self.writer], self.security)  # before `ready`: a clear start-up error
        sec, front = self.security, {FRONTEND: spec.addresses[FRONTEND]}
        self.out = Sender(self._ctx, self.transport.peers(self.writer, spec.addresses), sec)  # decoding loop only
        self._reply = Sender(self._ctx, front, sec)  # messaging loop only
        self._beat = Sender(self._ctx, front, sec)  # heartbeat thread only
        self._beating = threading.Event()

    # ----------------------------------------------------------------- life
    def ready_message(self, error: str | None = None) -> wire.Ready:
        return wire.Ready(writer=self.writer, pid=os.getpid(), inc=self.incarnation, block_size=self.engine.block_size,
                          blocks_total=self.engine.blocks_total,
                          max_model_len=self.max_model_len, vocab_size=self.vocab_size,
                          threads=self.stats.threads, batch_threshold=self.spec.batch_threshold,
                          max_wait_ms=self.spec.max_wait_ms, error=error)

    def serve(self) -> None:
        """Run until a shutdown message arrives."""
        self.receiver = Receiver(self._ctx, self.spec.addresses[self.writer], self.inbox.on_frame,
                                 name=f"msg-{self.writer}", security=self.security,
                                 on_refused=lambda: self._dropped("unauthenticated"))
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
        """Beat while the messaging loop runs: a process that can no longer hear the frontend
        stops beating, so it is declared down and replaced."""
        frame = wire.encode(wire.Heartbeat(writer=self.writer, pid=os.getpid(), inc=self.incarnation))
        while not self._beating.wait(HEARTBEAT_S):
            if not self.receiver.alive:
                log.error("%s: the messaging loop stopped; no more heartbeats", self.writer)
                return
            self._beat.send(FRONTEND, frame)

    def _dropped(self, reason: str) -> None:
        self.stats.frames_dropped[reason] = self.stats.frames_dropped.get(reason, 0) + 1

    def _answer_stats(self, msg: wire.Stats) -> None:  # messaging loop
        self._reply.send(FRONTEND, wire.encode(wire.StatsReply(id=msg.id, writer=self.writer, inc=self.incarnation,
                                                               stats=self.snapshot())))

    def snapshot(self) -> dict[str, Any]:
        used, total = self.engine.kv_usage()
        return self.stats.snapshot(blocks_used=used, blocks_free=total - used,
                                   engine_computed_tokens=self.engine.computed_tokens,
                                   pending=self.sched.count("pending"),
                                   ready=len(self.sched.ready()), requests=len(self.reqs))

    # -------------------------------------------------------- decoding loop
    def _decode_loop(self) -> None:
        while True:
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
            if (m.sender, m.inc) in self._fenced:
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

    def _new_seq(self) -> int:
        self._seq_counter += 1
        return self._seq_counter

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
        # the route state carries the sampling parameters to the peers
        st = RouteState(rid=m.rid, tokens=list(m.prompt), prompt_len=len(m.prompt),
                        writer=self.writer, route_seed=m.route_seed, sampling=m.sampling)
        self.reqs[m.rid] = Request(st, self._new_seq(), m.sampling)
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
        why = self._unfit(st.tokens)
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
        """Writer `m.writer`'s incarnation `m.inc` is dead: drop what it still sends, forget
        what it had read (its successor knows nothing), and tell the frontend what is here."""
        self._fenced.add((m.writer, m.inc))
        self._peer_inc[m.writer] = 0
        entries = []
        for rid, r in self.reqs.items():
            st = r.state
            if st.peer_read.pop(m.writer, 0):
                self._refill.add((rid, m.writer))
            pending = self.sched.state(rid) == "pending" and rid not in self._parked
            status = "ended" if st.finished else ("pending" if pending else "active")
            have = m.have.get(rid, r.n_out)
            tail = st.tokens[st.prompt_len + have:] if r.n_out > have else []
            entries.append(wire.CensusEntry(rid=rid, hops=st.hops, status=status, dest=st.writer,
                                            n_out=r.n_out, tail=tail))
        self.out.send(FRONTEND, wire.encode(wire.Census(writer=self.writer, inc=self.incarnation, round=m.round,
                                                        entries=entries)))

    def _peers(self, incarnations: dict[str, int]) -> None:
        """The peers' live incarnations: send what waited for a peer that is up now."""
        self._peer_inc.update({w: inc for w, inc in incarnations.items() if w != self.writer})
        for rid in [rid for rid in self._parked if self._peer_inc.get(self.reqs[rid].state.writer)]:
            self._parked.discard(rid)
            r = self.reqs[rid]
            self._send(r, r.state.writer)

    def _release(self, rid: str) -> None:
        self._parked.discard(rid)
        for peer in self.writers:
            self._refill.discard((rid, peer))
        self._tombstones[rid] = None
        if len(self._tombstones) > _TOMBSTONES:
            self._tombstones.popitem(last=False)
        r = self.reqs.pop(rid, None)
        t0 = time.perf_counter()
        if r is not None:
            self.engine.release(r)
        self.retention.release(rid)
        self.sched.remove(rid)
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
        res = self.runner.run([self.reqs[rid] for rid in rids])
        for r in res.looped:  # a rewrite came straight back: the program would loop forever
            self._fail(r.rid, f"{self.writer}: {LOOP_ERROR}")
        for r, why in res.failed:
            self._fail(r.rid, why)
        if not res.stepped:
            return
        for r in res.stepped:
            self.stats.queue_wait_s.observe((now - self.sched.ready_since(r.rid)) / 1e9)
        self.stats.prefill_tokens += res.fed_tokens
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
        to = self._peer_inc.get(dest, 0)
        if not to:  # the peer is down (or not yet known): the request waits here for it
            self._parked.add(rid)
            self.sched.depart(rid)
            return
        self.retention.before_send(r.state, dest)
        try:
            msg = self._compiled_send(r.state, dest)
        except Exception as exc:
            self._fail(rid, f"{self.writer}: cannot send to {dest}: {exc}")
            return
        self.stats.handoffs_out[dest] = self.stats.handoffs_out.get(dest, 0) + 1
        refill = (rid, dest) in self._refill
        self._refill.discard((rid, dest))
        frame = wire.encode(wire.Handoff(sender=self.writer, inc=self.incarnation, to=to, dest=dest, msg=msg,
                                         refill=refill))
        self.out.send(self.transport.hop(dest), frame)
        if self.retention.keep(rid, r.seq, r.state.tokens[:self.runner.fed(r)]):
            self.sched.depart(rid)
        else:  # forgotten here, as by an independent server; it may still come back
            del self.reqs[rid]
            self.sched.remove(rid)
            self.sched.announce(rid)

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


def run_thread(spec: SubserverSpec, ctx=None, load: Callable[..., LoadedWriter] | None = None) -> None:
    """Start and serve; a start-up failure is reported to the frontend. The entry point of a
    subserver thread (thread mode, with the caller's ZeroMQ context), and of a process.
    `load`: see `Subserver`."""
    try:
        sub = Subserver(spec, ctx=ctx, load=load)
    except Exception as exc:
        report_startup_failure(spec, exc, ctx=ctx)
        return
    sub.serve()


def exit_on_sigterm(signum, frame) -> None:
    """A terminated subserver unwinds (`finally` blocks run: a model build in progress removes
    its temporary folder) instead of vanishing mid-write."""
    raise SystemExit(128 + signum)


def run_process(spec_dict: dict[str, Any], load: Callable[..., LoadedWriter] | None = None) -> None:
    """Entry point of a subserver process (multiprocessing target, spawn start method);
    `load` is a module-level function, so it crosses the spawn boundary by name."""
    # progress lines and warnings (TOKENROUTER_LOG); a flood of bad frames is one line with a count
    logs.configure(f"tokenrouter [{spec_dict.get('writer')}]")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    signal.signal(signal.SIGINT, exit_on_sigterm)  # Ctrl-C at `serve`: unwind quietly, no KeyboardInterrupt traceback
    spec, parent = SubserverSpec(**spec_dict), os.getppid()
    bound_heap_growth()  # RSS flat over hours of changing batch sizes (memory.py)

    def watch_parent() -> None:  # no orphans: end with the process that started us
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    run_thread(spec, load=load)
