"""The frontend's own parts without a runtime: KV admission (`KvAdmission`) and the liveness
watch (`Watch`), each driven through the callables and public names the `Frontend` uses."""

import asyncio
import time

from tokenrouter.runtime.frontend.admission import KvAdmission, blocks_needed
from tokenrouter.runtime.frontend.liveness import Watch


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
                  heartbeat_timeout_s=1.0, max_restarts=1, on_fatal=lambda msg: calls.append(("fatal", msg)))
        w.reported_ready("a", 11, 101)
        w.reported_ready("b", 12, 102)
        assert w.all_up and not w.down() and w.accepts("a", 101) and not w.accepts("a", 102)
        w.start().cancel()  # the frontend's start; the checks are driven by hand below
        # silence while the receive loop has a backlog is not a death; silence after it read everything is
        w.live["a"].last_seen = w.live["b"].last_seen = time.monotonic() - 10
        drained[0] = w.live["a"].last_seen + 0.5
        await w.check()
        assert w.all_up and calls == []
        drained[0] = time.monotonic()
        w.seen("b")
        await w.check()
        assert w.down() == ["subserver a is down (no heartbeat for 10.0 s)"] and calls == [("lost", "a", 101),
                                                                                           ("wake",)]
        assert not w.accepts("a", 101) and w.is_dead("a", 101)  # a dead incarnation stays dead
        w.reported_ready("a", 13, 103)
        assert w.all_up and w.accepts("a", 103)
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
