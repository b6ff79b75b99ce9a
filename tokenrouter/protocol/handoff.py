"""The handoff: what moves a request from one writer to another (invariant 2 of
docs/architecture.md: only the suffix the receiver has not read crosses the wire).

`send` builds the `PeerMessage` taking a request's `RouteState` to a peer and records
that the peer has now read every token; `receive` creates the request at its first visit
or appends the suffix it has not seen, refusing a message that does not line up with what
is known (a gap, an overlap that differs, another request's state). Written once: every
generated router's `send`/`receive` (`router.Router`) and every subserver go through here.
"""

from __future__ import annotations

from tokenrouter.protocol.state import PeerMessage, RouteState

__all__ = ["MessageError", "receive", "send"]


class MessageError(ValueError):
    """A peer message that does not line up with what this subserver knows."""


def send(state: RouteState, peer: str, sender: str, writers: tuple[str, ...]) -> PeerMessage:
    """The message taking `state` to `peer` (a writer: a model, or an ensemble served by
    its own subserver): only the tokens `peer` has not read."""
    if peer not in writers:
        raise MessageError(f"request {state.rid}: unknown peer {peer!r}")
    start = state.peer_read.get(peer, 0)
    if start > len(state.tokens):
        raise MessageError(f"request {state.rid}: {peer!r} has read {start} tokens but only "
                           f"{len(state.tokens)} exist")
    msg = PeerMessage(rid=state.rid, suffix=list(state.tokens[start:]), start=start,
                      prompt_len=state.prompt_len, writer=state.writer,
                      visit_tokens=state.visit_tokens, route_seed=state.route_seed,
                      written_by=dict(state.written_by), sampling=state.sampling,
                      finished=state.finished, sender=sender, hops=state.hops + 1)
    state.peer_read[peer] = len(state.tokens)
    state.hops += 1
    return msg


def receive(msg: PeerMessage, state: RouteState | None, writers: tuple[str, ...]) -> RouteState:
    """Create the request (first visit) or append the suffix it has not seen."""
    if msg.writer not in writers:
        raise MessageError(f"request {msg.rid}: unknown writer {msg.writer!r}")
    end = msg.start + len(msg.suffix)
    if state is None:
        if msg.start != 0:
            raise MessageError(f"request {msg.rid}: first message starts at token {msg.start}, not 0")
        state = RouteState(rid=msg.rid, tokens=list(msg.suffix), prompt_len=msg.prompt_len,
                           writer=msg.writer)
    else:
        have = len(state.tokens)
        if state.rid != msg.rid:
            raise MessageError(f"message for {msg.rid} given the state of {state.rid}")
        if state.prompt_len != msg.prompt_len:
            raise MessageError(f"request {msg.rid}: prompt length {msg.prompt_len} != {state.prompt_len}")
        if msg.start > have:
            raise MessageError(f"request {msg.rid}: gap: message starts at {msg.start}, {have} tokens known")
        if end < have:
            raise MessageError(f"request {msg.rid}: message ends at {end}, before the {have} tokens known")
        if state.tokens[msg.start:have] != msg.suffix[:have - msg.start]:
            raise MessageError(f"request {msg.rid}: overlap at {msg.start}..{have} does not match")
        state.tokens.extend(msg.suffix[have - msg.start:])
    state.writer = msg.writer
    state.visit_tokens = msg.visit_tokens
    state.route_seed = msg.route_seed
    state.written_by = dict(msg.written_by)
    state.sampling = msg.sampling
    state.finished = msg.finished
    state.hops = msg.hops
    if msg.sender:
        state.peer_read[msg.sender] = end
    return state
