"""The scheduler alone: request states and the delayed-batching rule (invariant 4)."""

import pytest
from hypothesis import given, settings, strategies as st

from tokenrouter.runtime.subserver.scheduler import Scheduler

MS = 1_000_000


def test_states_and_pending_is_skipped():
    s = Scheduler(batch_threshold=1)
    s.add("a", now=0)
    s.add("b", now=1)
    assert s.decide(2).batch == ("a", "b")
    s.stepped(["a", "b"], now=3)
    assert s.state("a") == "running"
    s.depart("a")
    assert s.state("a") == "pending"
    assert s.decide(4).batch == ("b",)  # the pending request is skipped
    s.returned("a", now=5)
    assert s.state("a") == "returning"
    assert set(s.decide(6).batch) == {"a", "b"}
    s.remove("a")
    assert "a" not in s and s.live == 1


def test_return_of_a_request_that_is_not_pending_is_an_error():
    s = Scheduler()
    with pytest.raises(KeyError):
        s.returned("x", 0)
    s.add("x", 0)
    with pytest.raises(KeyError):
        s.returned("x", 0)  # it is waiting, not pending
    with pytest.raises(KeyError):
        s.add("x", 0)


def test_waits_for_threshold_while_more_can_arrive():
    s = Scheduler(batch_threshold=3, max_wait_ns=20 * MS)
    for r in "abcd":
        s.announce(r)  # four requests live in the system
    s.add("a", now=0)
    d = s.decide(1 * MS)
    assert d.batch == () and d.wait_until == 20 * MS and d.reason == "waiting"
    s.add("b", now=2 * MS)
    assert s.decide(3 * MS).batch == ()
    s.add("c", now=4 * MS)
    d = s.decide(5 * MS)
    assert d.batch == ("a", "b", "c") and d.reason == "threshold"


def test_max_wait_bounds_the_wait():
    s = Scheduler(batch_threshold=4, max_wait_ns=20 * MS)
    for r in "abcdef":
        s.announce(r)
    s.add("a", now=0)
    s.add("b", now=10 * MS)
    assert s.decide(19 * MS).wait_until == 20 * MS  # the oldest one sets the deadline
    d = s.decide(20 * MS)
    assert d.batch == ("a", "b") and d.reason == "max_wait"


def test_no_wait_when_nothing_more_can_arrive():
    s = Scheduler(batch_threshold=8, max_wait_ns=10**12)
    s.announce("a")
    s.announce("b")
    s.add("a", now=0)
    assert s.decide(1).batch == ()  # b is live elsewhere: it may come
    s.remove("b")  # b finished
    d = s.decide(2)
    assert d.batch == ("a",) and d.reason == "no_more_can_arrive"


def test_pending_requests_here_count_as_possible_arrivals():
    s = Scheduler(batch_threshold=2, max_wait_ns=50 * MS)
    s.add("a", 0)
    s.add("b", 0)
    s.stepped(["a", "b"], 1)
    s.depart("b")  # b is away, it will come back
    assert s.decide(2).batch == ()
    s.returned("b", now=5)
    assert s.decide(6).batch == ("a", "b")


def test_batch_limits():
    s = Scheduler(batch_threshold=1, max_batch=2)
    s.add("a", 0)
    s.add("b", 1)
    s.add("c", 2)
    assert s.decide(3).batch == ("a", "b")  # oldest first, at most max_batch
    s.stepped(["a", "b"], 4)
    assert s.decide(5).batch == ("c", "a")


def test_bad_settings():
    with pytest.raises(ValueError):
        Scheduler(batch_threshold=0)
    with pytest.raises(ValueError):
        Scheduler(max_wait_ns=-1)


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 6), n=st.integers(1, 8), wait=st.integers(0, 30),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(0, 10)), max_size=60))
def test_invariant_4_never_deadlocks_and_never_waits_past_max(B, n, wait, ops):
    """Random arrivals, departures and endings: whenever the scheduler waits, some live
    request is not ready here (so more can arrive), and it never waits past the oldest
    ready request's deadline."""
    s = Scheduler(batch_threshold=B, max_wait_ns=wait)
    now = 0
    rids = [f"r{i}" for i in range(n)]
    for r in rids:
        s.announce(r)
    for op, i, dt in ops:
        now += dt
        r = rids[i % n]
        st_ = s.state(r)
        if op == 0 and st_ is None and r in s._live:
            s.add(r, now)
        elif op == 1 and st_ in ("waiting", "running", "returning"):
            s.depart(r)
        elif op == 2 and st_ == "pending":
            s.returned(r, now)
        elif op == 3:
            s.remove(r)
        d = s.decide(now)
        ready = s.ready()
        if d.batch:
            assert set(d.batch) <= set(ready)
            assert len(d.batch) >= min(B, len(ready)) or d.reason in ("max_wait", "no_more_can_arrive", "full")
        elif ready:
            assert s.live > len(ready), "waited although nothing more can arrive"
            oldest = min(s.ready_since(x) for x in ready)
            assert d.wait_until == oldest + wait and d.wait_until > now
            # at the deadline it launches
            assert s.decide(d.wait_until).batch
        else:
            assert d.wait_until is None
        if d.batch:
            s.stepped(d.batch, now)
