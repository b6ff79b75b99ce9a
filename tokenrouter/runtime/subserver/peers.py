"""A subserver's peers: how a handoff addresses each other writer, which incarnation of each
is live, which are dead, and what that means for the requests held here.

The compiled `send` addresses models; an ensemble writer is reached through one of its
members' names (`Peers.message`).

When a peer's process dies, the frontend says so (`peer_down`, `Peers.down`): this
subserver then drops that incarnation's handoffs (`fenced`), forgets what the peer had read
of each request (the next handoff to its successor carries the whole context, `refill`),
and answers with a census of its requests, from which the frontend decides which requests
were lost with the peer (`frontend/recovery.py`); those come back as `resume` messages. A
request departing to a peer that is down waits here (parked) until the frontend's `peers`
says which incarnation is live (`Peers.up`); every handoff names it (`to`), so one sent to
a dead predecessor is dropped by its successor.

`Peers` holds that state for the `Subserver`, which owns it and passes in the requests it
holds; it sends nothing itself.
"""

from __future__ import annotations

from typing import Any, Callable

from tokenrouter.protocol.state import PeerMessage, RouteState
from tokenrouter.runtime.subserver.request import Request
from tokenrouter.runtime.transport import wire


class Peers:
    """`program`: the `ir.Program` (its writers, models and ensembles); `router`: this
    writer's compiled router, whose `send` makes the handoffs."""

    def __init__(self, writer: str, program: Any, router: Any):
        self.writer = writer
        self.writers = program.writers()
        self.router = router
        self._model_names = {m.name for m in program.models}
        self._ensemble_members = {e.name: e.members for e in program.ensembles}
        self._fenced: set[tuple[str, int]] = set()  # (writer, incarnation) the frontend declared dead
        self._refill: set[tuple[str, str]] = set()  # (rid, peer): the peer lost the request's KV
        self._inc: dict[str, int] = {}  # each peer's live incarnation (the frontend's `peers`)
        self._parked: set[str] = set()  # departed to a peer that is down: sent when it is up

    def message(self, st: RouteState, dest: str) -> PeerMessage:
        """The compiled `send` of `st` to writer `dest`; to an ensemble writer through one of
        its members' names, while `peer_read` stays keyed by the writer (as the compiled
        `receive` keys it by the message's sender)."""
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

    def live(self, writer: str) -> int:
        """`writer`'s live incarnation (0: down, or not yet known)."""
        return self._inc.get(writer, 0)

    def fenced(self, writer: str, inc: int) -> bool:
        """Whether incarnation `inc` of `writer` was declared dead (its handoffs are stale)."""
        return (writer, inc) in self._fenced

    def down(self, m: wire.PeerDown, reqs: dict[str, Request],
             state: Callable[[str], str]) -> list[wire.CensusEntry]:
        """Writer `m.writer`'s incarnation `m.inc` is dead: drop what it still sends, forget
        what it had read (its successor knows nothing); the census of `reqs` for the frontend
        (`state`: a request's scheduler state)."""
        self._fenced.add((m.writer, m.inc))
        self._inc[m.writer] = 0
        entries = []
        for rid, r in reqs.items():
            st = r.state
            if st.peer_read.pop(m.writer, 0):
                self._refill.add((rid, m.writer))
            pending = state(rid) == "pending" and rid not in self._parked
            status = "ended" if st.finished else ("pending" if pending else "active")
            have = m.have.get(rid, r.n_out)
            tail = st.tokens[st.prompt_len + have:] if r.n_out > have else []
            entries.append(wire.CensusEntry(rid=rid, hops=st.hops, status=status, dest=st.writer,
                                            n_out=r.n_out, tail=tail))
        return entries

    def up(self, incarnations: dict[str, int], reqs: dict[str, Request]) -> list[str]:
        """The peers' live incarnations: the parked requests whose peer is up now (each to be
        unparked and sent)."""
        self._inc.update({w: inc for w, inc in incarnations.items() if w != self.writer})
        return [rid for rid in self._parked if self._inc.get(reqs[rid].state.writer)]

    def park(self, rid: str) -> None:
        """`rid` departs to a peer that is down: it waits here until `up` names its incarnation."""
        self._parked.add(rid)

    def unpark(self, rid: str) -> None:
        self._parked.discard(rid)

    def take_refill(self, rid: str, dest: str) -> bool:
        """Whether the handoff of `rid` to `dest` is a refill (`dest` lost its KV); once."""
        refill = (rid, dest) in self._refill
        self._refill.discard((rid, dest))
        return refill

    def forget(self, rid: str) -> None:
        """`rid` was released."""
        self._parked.discard(rid)
        for peer in self.writers:
            self._refill.discard((rid, peer))
