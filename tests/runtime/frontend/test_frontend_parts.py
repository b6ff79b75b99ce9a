"""The frontend's own parts without a runtime: KV admission (`KvAdmission`), the liveness
watch (`Watch`) and the recovery of a dead subserver's requests (`Recovery`), each driven
through the callables and public names the `Frontend` uses."""

import asyncio
import time

from tokenrouter.protocol.sampling import SamplingParams
from tokenrouter.runtime.frontend.admission import KvAdmission, blocks_needed
from tokenrouter.runtime.frontend.liveness import Watch
from tokenrouter.runtime.frontend.recovery import Recovery, route_at
from tokenrouter.runtime.frontend.streams import RequestStream
from tokenrouter.runtime.transport import wire


def test_blocks_needed():
    assert blocks_needed(10, 6, 16) == 2 and blocks_needed(10, 7, 16) == 3 and blocks_needed(1, 1, 0) == 3


def test_admission_waits_for_free_blocks_and_gives_up_when_unhealthy():
    async def run():
        healthy = [True]
        adm = KvAdmission(lambda: healthy[0])
        adm.capacity = 10
        assert await adm.reserve(6)
        got = []

        async def want(n, tag):
            got.append((tag, await adm.reserve(n)))

        waiters = [asyncio.create_task(want(5, "a")), asyncio.create_task(want(4, "b"))]
        await asyncio.sleep(0.01)
        assert adm.queued == 1 and got == [("b", True)]  # 6 + 4 fit: b goes ahead; 6 + 5 do not
        await adm.release(6)
        await asyncio.sleep(0.01)
        assert got == [("b", True), ("a", True)] and adm.reserved == 9 and adm.queued == 0
        late = asyncio.create_task(want(5, "c"))
        await asyncio.sleep(0.01)
        healthy[0] = False
        await adm.wake()
        await asyncio.gather(*waiters, late)
        assert got[-1] == ("c", False) and adm.reserved == 9

    asyncio.run(run())


def test_a_watch_recovers_what_a_death_took_restarts_and_gives_up_through_its_callables():
    async def run():
        calls = []
        alive = {"a": True, "b": True}
        drained = [0.0]

        async def release(w, rid):
            calls.append(("release", w, rid))

        async def wake():
            calls.append(("wake",))

        w = Watch(["a", "b"], end_all=lambda msg: calls.append(("end_all", msg)) or 3,
                  lost=lambda name, inc: calls.append(("lost", name, inc)), release=release, wake=wake,
                  drained=lambda: drained[0], alive=lambda: dict(alive),
                  restart=lambda name: calls.append(("restart", name)),
                  heartbeat_timeout_s=1.0, stall_window_s=2.0, max_restarts=1,
                  on_fatal=lambda msg: calls.append(("fatal", msg)))
        w.reported_ready("a", 11, 101)
        w.reported_ready("b", 12, 102)
        assert w.all_up and not w.down() and w.accepts("a", 101) and not w.accepts("a", 102)
        w.start().cancel()  # the frontend's start; the checks are driven by hand below
        # no progress while the receive loop has a backlog is not a hang; no progress after it
        # read everything is, and so is none for two windows whatever the backlog
        for lv in (w.live["a"], w.live["b"]):
            lv.last_seen = lv.progress_at = time.monotonic() - 2.5
        drained[0] = w.live["a"].last_seen + 0.5
        await w.check()
        assert w.all_up and calls == []
        drained[0] = time.monotonic()
        w.seen("b", wire.Heartbeat(writer="b", pid=12, inc=102, waiting=True))
        await w.check()
        assert w.down() == ["subserver a is down (silent for 2.5 s: stopped or hung (the stall window is 2 s))"]
        assert calls == [("lost", "a", 101), ("wake",)]
        assert not w.accepts("a", 101) and w.is_dead("a", 101)  # a dead incarnation stays dead
        w.reported_ready("a", 13, 103)
        assert w.all_up and w.accepts("a", 103)
        w.live["a"].last_seen = w.live["a"].progress_at = time.monotonic() - 4.5
        drained[0] = 0.0
        w.seen("b", wire.Heartbeat(writer="b", pid=12, inc=102, waiting=True))
        await w.check()
        assert calls[-2] == ("lost", "a", 103)
        w.reported_ready("a", 15, 105)
        calls.clear()
        alive["b"] = False
        await w.check()
        assert not w.all_up and w.down() == ["subserver b is down (its process exited)"]
        assert calls == [("lost", "b", 102), ("wake",)]  # nothing in flight is failed
        w.remember_ended("r1")
        await w.check()  # the first restart comes at once
        assert calls[-1] == ("restart", "b") and w.live["b"].restarts == 1
        w.reported_ready("b", 14, 104)  # back: what ended meanwhile is released there again
        await asyncio.sleep(0.01)
        assert w.all_up and calls[-1] == ("release", "b", "r1")
        alive["b"] = False
        await w.check()  # down again; one failed restart in a row is all max_restarts allows
        w.live["b"].next_restart = 0.0
        await w.check()
        assert w.fatal and "giving up" in w.fatal and calls[-1] == ("fatal", w.fatal)
        assert ("end_all", w.fatal) in calls

    asyncio.run(run())


def _stream(out, writers, nexts, prompt=(1, 2, 3), **params):
    live = RequestStream("r", 4, prompt=list(prompt), params=SamplingParams(max_tokens=params.get("max_tokens", 50)))
    for pos, (tok, by, nxt) in enumerate(zip(out, writers, nexts)):
        live.add(pos, tok, by, nxt)
    live.flush()
    return live


def test_the_route_state_at_the_frontends_last_token():
    assert route_at(_stream([], [], []), "s").writer == "s"
    # s wrote two and stays; then l wrote one and hands back (keep): s is next, visit 0
    at = route_at(_stream([5, 6], ["s", "s"], ["s", "s"]), "s")
    assert (at.writer, at.visit_tokens) == ("s", 2)
    at = route_at(_stream([5, 6, 7], ["s", "s", "l"], ["s", "l", "s"]), "s")
    assert (at.writer, at.visit_tokens) == ("s", 0)
    # l's token sent it away and l's rewrite brought it straight back: a new visit of l, 1 token in
    at = route_at(_stream([5, 6, 7], ["l", "l", "l"], ["l", "s", "l"]), "s")
    assert (at.writer, at.visit_tokens) == ("l", 1)


def test_a_recovery_round_resumes_only_what_the_dead_held_and_refills_what_its_frames_lost():

    async def run():
        sent, ended = [], []
        incs = {"s": 11, "l": 0}  # l (incarnation 22) just died
        reqs = {}
        for rid, (out, by, nx) in {"active": ([5], ["s"], ["s"]), "pending_l": ([5], ["s"], ["l"]),
                                   "only_l": ([5, 6], ["l", "l"], ["l", "l"]), "hole": ([5], ["s"], ["l"]),
                                   "to_s": ([5], ["s"], ["l"]), "done": ([5, 2], ["s", "l"], ["l", "l"])}.items():
            live = _stream(out, by, nx)
            live.rid = rid
            reqs[rid] = live
        reqs["done"].params = reqs["done"].params.replace(stop_token_ids=(2,))
        rec = Recovery("s", ["s", "l"], reqs, send=lambda w, m: sent.append((w, m)), incarnation=incs.get,
                       flush=lambda live: None, end=lambda live, final: ended.append((live.rid, final.reason)),
                       max_model_len=lambda: 100)
        rec.start_round("l", 22)
        (w, down), = sent
        assert w == "s" and down.writer == "l" and down.inc == 22 and down.have["only_l"] == 2
        E = wire.CensusEntry
        rec.on_census(wire.Census(writer="s", inc=11, round=down.round, entries=[
            E(rid="active", hops=0, status="active", dest="s", n_out=1),
            E(rid="pending_l", hops=1, status="pending", dest="l", n_out=1),
            E(rid="hole", hops=3, status="active", dest="s", n_out=3, tail=[8, 9]),  # l's frames of 8, 9 died
            E(rid="to_s", hops=2, status="pending", dest="l", n_out=1),
        ]))
        assert not rec.rounds  # every survivor answered: decided
        # untouched: active at the survivor (the hole refilled, written by the dead writer)
        assert reqs["hole"].buf == {1: (8, "l", "l", None), 2: (9, "l", "s", None)} and rec.lost_tokens == 2
        # lost: pending on its way to the dead one, or held by nobody; a finished one just ends
        assert ended == [("done", "stop")]
        assert sorted(rec.records) == ["only_l", "pending_l", "to_s"]
        assert rec.records["only_l"].at.writer == "l" and rec.records["only_l"].at.visit_tokens == 2
        assert rec.records["to_s"].at.writer == "l" and rec.records["to_s"].hops == 3
        assert all(not r.sent_to for r in rec.records.values()) and rec.busy  # l is down: they wait
        incs["l"] = 33
        rec.came_up("l")
        resumes = [m for w, m in sent if isinstance(m, wire.Resume)]
        assert {m.msg.rid for m in resumes} == {"only_l", "pending_l", "to_s"} and all(m.to == 33 for m in resumes)
        only = next(m.msg for m in resumes if m.msg.rid == "only_l")
        assert only.suffix == [1, 2, 3, 5, 6] and only.start == 0 and only.written_by == {"l": 2}
        assert not rec.busy
        # the resumed copy is lost again with the next incarnation: resumed once more, one hop later
        incs["l"] = 0
        rec.start_round("l", 33)
        down = sent[-1][1]
        rec.on_census(wire.Census(writer="s", inc=11, round=down.round, entries=[
            E(rid="active", hops=0, status="active", dest="s", n_out=1)]))
        assert rec.records["only_l"].hops == 2 and rec.records["to_s"].hops == 4

    asyncio.run(run())


def test_a_local_subserver_that_cannot_be_restarted_makes_the_runtime_give_up():
    async def run():
        calls = []

        async def noop(*a):
            pass

        w = Watch(["a"], end_all=lambda msg: calls.append(("end_all", msg)) or 0, lost=lambda *a: None,
                  release=noop, wake=noop, alive=lambda: {"a": False}, restart=None,
                  on_fatal=lambda msg: calls.append(("fatal", msg)))
        w.reported_ready("a", 1, 7)
        w.start().cancel()
        await w.check()  # down (its thread ended) ...
        await w.check()  # ... and nothing can bring it back: requests end now, not at their deadline
        assert w.fatal and "cannot be restarted" in w.fatal and calls[-1] == ("fatal", w.fatal)

    asyncio.run(run())


def test_a_silent_subserver_thread_is_starved_not_dead():
    async def run():
        async def noop(*a):
            pass

        def watch(restart):
            w = Watch(["a"], end_all=lambda msg: 0, lost=lambda *a: None, release=noop, wake=noop,
                      alive=lambda: {"a": True}, restart=restart, heartbeat_timeout_s=0.01, stall_window_s=0.01)
            w.reported_ready("a", 1, 7)
            w.start().cancel()
            return w

        threads, processes = watch(None), watch(lambda w: None)
        await asyncio.sleep(0.05)  # silent for five timeouts
        await threads.check()
        await processes.check()
        assert threads.live["a"].up and not threads.fatal  # another thread held the GIL
        assert not processes.live["a"].up  # a silent process is down

    asyncio.run(run())


def _beat(turns=0, cpu_ms=0, waiting=False, writer="a", inc=7):
    return wire.Heartbeat(writer=writer, pid=1, inc=inc, turns=turns, waiting=waiting, cpu_ms=cpu_ms)


def test_a_subserver_is_judged_by_its_progress_not_by_a_clock():
    """Past the stall window: computing (CPU time moves), idle (waiting for work), or heard
    late but moving, a process is up; silent, or heard with nothing moving, it is down. A
    stats reply (the messaging loop) is no progress. A remote subserver is down after the
    heartbeat timeout of silence too, and stuck after the window like a local one."""
    async def noop(*a):
        pass

    def watch(alive, **kw):
        w = Watch(["a"], end_all=lambda msg: 0, lost=lambda *a: None, release=noop, wake=noop,
                  alive=lambda: alive, restart=lambda name: None, **kw)
        w.reported_ready("a", 1, 7)
        w.start().cancel()
        return w

    async def feed(w, beats, every=0.05):
        for b in beats:
            w.seen("a", b)
            await asyncio.sleep(every)
            await w.check()
            if not w.all_up:
                return  # declared down (the next check would restart it)

    async def run():
        window = 0.3

        async def judged(beats, every=0.05):
            w = watch({"a": True}, stall_window_s=window)
            await feed(w, beats, every)
            return w

        busy = await judged([_beat(turns=4, cpu_ms=100 + 5 * i) for i in range(12)])  # one step of 0.6 s
        idle = await judged([_beat(turns=4, cpu_ms=100, waiting=True) for _ in range(12)])
        late = await judged([_beat(turns=4 + i) for i in range(3)], every=0.25)  # every beat late, each moving
        stuck = await judged([_beat(turns=4, cpu_ms=100) for _ in range(12)])
        stats = await judged([wire.StatsReply(id=1, writer="a", inc=7, stats={}) for _ in range(12)])
        silent = watch({"a": True}, stall_window_s=window)
        await asyncio.sleep(window + 0.05)
        await silent.check()
        assert busy.all_up and idle.all_up and late.all_up
        assert not stuck.all_up and "stuck: its heartbeats say its decoding loop made no progress" in stuck.down()[0]
        assert not silent.all_up and "silent for" in silent.down()[0] and "stopped or hung" in silent.down()[0]
        assert not stats.all_up and "silent for" in stats.down()[0]  # the messaging loop answers; no heartbeat
        assert busy.gaps()["a"]["progress"] < window and late.gaps()["a"]["heartbeat"] >= 0.25

        remote_silent = watch({}, heartbeat_timeout_s=0.1, stall_window_s=window)
        remote_stuck = watch({}, heartbeat_timeout_s=0.1, stall_window_s=window)
        await feed(remote_stuck, [_beat(turns=4, cpu_ms=100) for _ in range(3)])
        assert remote_stuck.all_up  # heard, stuck for less than the window
        await asyncio.sleep(0.15)
        await remote_silent.check()
        assert not remote_silent.all_up and "no heartbeat for" in remote_silent.down()[0]
        await feed(remote_stuck, [_beat(turns=4, cpu_ms=100) for _ in range(6)])
        assert not remote_stuck.all_up and "stuck" in remote_stuck.down()[0]

    asyncio.run(run())
