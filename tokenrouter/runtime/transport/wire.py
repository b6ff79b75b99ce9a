"""The messages that cross a ZeroMQ socket between the frontend and subservers.

Every frame is one JSON object with a wire version `v` and a type `t`. A handoff carries an
`protocol.state.PeerMessage` (the only message that moves a request between models); the rest are
small control messages defined here. Nothing is ever pickled: a frame from another host
is data, validated by pydantic on the way in, and a frame of an unknown type or version is
rejected with a clear error instead of being executed.

Validation is complete, because a peer may be hostile or broken: every number has bounds,
every string and list a maximum length, sampling parameters are the strict, bounded
`protocol.sampling.SamplingParams` (in a `submit` and inside a handoff's `PeerMessage`),
and a frame longer than `MAX_FRAME` bytes is refused before it is parsed (the sockets also
refuse it, `sockets.py`), one nested deeper than the parser's recursion guard while it is
parsed. `decode` turns every failure into a `WireError`; the receivers drop and count such
a frame (`tokenrouter_frames_dropped_total`).

Incarnations. Every subserver process draws a random `incarnation` when it starts. What it
sends carries it (`inc`), and what the frontend sends a subserver carries the incarnation
it is meant for (`to`): a restarted process binds the same address, so frames queued for
its dead predecessor reach it, and it drops them; the frontend takes frames only from the
incarnation that reported `ready` (`frontend/liveness.py`), and survivors drop handoffs
from an incarnation the frontend declared dead (`peer_down`).

Directions:
  frontend -> subserver: submit, announce, release, stats, shutdown, configure, debug_fail,
                         debug_hold, peers, peer_down, resume
  subserver -> subserver: handoff
  subserver -> frontend:  ready, heartbeat, tokens, done, stats_reply, census,
                          handoff (`relay` transport only)
"""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tokenrouter.protocol.sampling import MAX_LOGPROBS, MAX_TOKENS, TOKEN_ID_MAX, SamplingParams, Seed
from tokenrouter.protocol.state import PeerMessage

CONTROL_VERSION = 1
FRONTEND = "frontend"  # the frontend's name among the endpoints (the others are writers)

MAX_FRAME = 32 << 20  # bytes; a 1M-token prompt is about 8 MB of JSON
# MAX_TOKENS (the longest token list) and TOKEN_ID_MAX come from protocol.sampling
MAX_NAME = 128  # request ids, writer names, reasons
MAX_ITEMS = 1 << 16  # token events in one `tokens` frame, entries in a small dict

Name = Annotated[str, Field(max_length=MAX_NAME)]
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
Count = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
Counts = Annotated[dict[Name, Count], Field(max_length=256)]
Incarnation = Annotated[int, Field(ge=1, lt=1 << 63)]  # a subserver process's random id (`new_incarnation`)
Total = Annotated[int, Field(ge=0, lt=1 << 63)]  # a running total (a process's loop turns, CPU milliseconds)
MAX_REQUESTS = 1 << 20  # requests one message may list (a census, a peer_down's checkpoints)


def new_incarnation() -> int:
    """A subserver process's incarnation: random, so a restarted process never reuses one."""
    return secrets.randbits(62) + 1


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    v: int = CONTROL_VERSION


class Submit(_Msg):
    """A new request for the start writer's subserver."""

    t: Literal["submit"] = "submit"
    to: Incarnation
    rid: Name
    prompt: list[TokenId] = Field(min_length=1, max_length=MAX_TOKENS)
    sampling: SamplingParams = SamplingParams()
    route_seed: Seed = 0  # the seed of the program's coin flips (`protocol.state`)
    fork_of: Name | None = None  # a request with the same prompt whose prompt KV this one may share (`n` > 1)


class Announce(_Msg):
    """A request now exists in the system (sent to every subserver but the start one), so
    delayed batching knows how many requests could still arrive."""

    t: Literal["announce"] = "announce"
    to: Incarnation
    rid: Name


class Release(_Msg):
    """The request ended (finished, aborted or failed): free its KV and forget it."""

    t: Literal["release"] = "release"
    to: Incarnation
    rid: Name
    reason: Name = "finished"


def bounded_peer_message(m: PeerMessage) -> PeerMessage:
    """`PeerMessage` (`protocol.state`) types its seed and sampling parameters but leaves
    names, token ids and positions loose; a handoff or a resume is held to the same bounds
    as a submit."""
    if len(m.rid) > MAX_NAME or len(m.writer) > MAX_NAME or len(m.sender) > MAX_NAME:
        raise ValueError("a name is too long")
    if len(m.suffix) > MAX_TOKENS or any(not 0 <= t <= TOKEN_ID_MAX for t in m.suffix):
        raise ValueError("suffix too long or a token id out of range")
    for v in (m.start, m.prompt_len, m.visit_tokens, m.hops):
        if not 0 <= v <= MAX_TOKENS * 2:
            raise ValueError(f"a position or count ({v}) is out of range")
    if len(m.written_by) > 256 or any(len(k) > MAX_NAME or not 0 <= n <= TOKEN_ID_MAX
                                      for k, n in m.written_by.items()):
        raise ValueError("written_by is out of bounds")
    return m


BoundedPeerMessage = Annotated[PeerMessage, AfterValidator(bounded_peer_message)]


class Handoff(_Msg):
    """A request moves to the receiving writer. `sender` is the writer that sent it, `inc`
    its incarnation, `to` the receiver's (from the frontend's `peers`). `refill`: the
    message carries the whole context again because the receiver restarted and lost the
    request's KV (counted there as a re-prefill)."""

    t: Literal["handoff"] = "handoff"
    sender: Name
    inc: Incarnation
    to: Incarnation
    dest: Name
    msg: BoundedPeerMessage
    refill: bool = False


class Resume(_Msg):
    """The frontend gives a request back to a writer after the process that held it died:
    everything the frontend received of it (`msg.start` 0), in the route state it had
    there. The receiver re-prefills it, or extends what it kept of it (a pending request)."""

    t: Literal["resume"] = "resume"
    to: Incarnation
    msg: BoundedPeerMessage


class Peers(_Msg):
    """The incarnation of every writer (0: down), so handoffs go to the live one; a
    subserver keeps a departure to a writer that is down until it is up again."""

    t: Literal["peers"] = "peers"
    to: Incarnation
    incarnations: Annotated[dict[Name, Annotated[int, Field(ge=0, lt=1 << 63)]], Field(max_length=256)]


class PeerDown(_Msg):
    """Writer `writer`'s incarnation `inc` is dead: drop its handoffs from now on, forget what
    it had read of every request (its successor knows nothing), and answer with a `census`
    of the requests held here. `have`: the output tokens the frontend holds of each request,
    so the census can send back those it lacks."""

    t: Literal["peer_down"] = "peer_down"
    to: Incarnation
    round: Count
    writer: Name
    inc: Incarnation
    have: Annotated[dict[Name, Count], Field(max_length=MAX_REQUESTS)] = {}


class CensusEntry(BaseModel):
    """One request as a subserver holds it when it hears of a peer's death."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rid: Name
    hops: Count
    status: Literal["active", "pending", "ended"]  # steps here / away at `dest` / ended here
    dest: Name  # the writer of its next token (where a pending request went)
    n_out: Count  # output tokens known here
    tail: list[TokenId] = Field(default=[], max_length=MAX_TOKENS)  # outputs from the frontend's `have` on


class Census(_Msg):
    """A subserver's answer to `peer_down`: every request it holds."""

    t: Literal["census"] = "census"
    writer: Name
    inc: Incarnation
    round: Count
    entries: list[CensusEntry] = Field(max_length=MAX_REQUESTS)


class Ready(_Msg):
    """A subserver has loaded its engines and is serving."""

    t: Literal["ready"] = "ready"
    writer: Name
    pid: Count
    inc: Incarnation
    block_size: Count
    blocks_total: Count
    max_model_len: Count
    vocab_size: Count
    threads: Count
    batch_threshold: Count
    max_wait_ms: float = Field(ge=0, le=1e7, allow_inf_nan=False)
    error: Annotated[str, Field(max_length=8192)] | None = None  # start-up failed; the subserver exits


class Heartbeat(_Msg):
    """A subserver is alive (sent every `HEARTBEAT_S` from its own thread, so a long step
    does not delay it), and what its decoding loop did (`subserver/progress.py`): the turns
    it finished, whether it waits for messages, the CPU time its thread used. The frontend
    tells "alive and busy" from "alive but stuck" by them (`frontend/liveness.py`). `inc`
    tells a restarted process from the old one."""

    t: Literal["heartbeat"] = "heartbeat"
    writer: Name
    pid: Count
    inc: Incarnation
    turns: Total = 0
    waiting: bool = False
    cpu_ms: Total = 0


Logprob = Annotated[float, Field(ge=-1e9, le=0.0, allow_inf_nan=False)]
TopLogprobs = Annotated[list[tuple[TokenId, Logprob]], Field(max_length=MAX_LOGPROBS)]


class Tokens(_Msg):
    """Tokens committed in one step: items are [rid, output position, token id, the writer
    of the request's next token] (the frontend keeps the last, to resume a request in the
    route state it had if a subserver dies); `logprobs`, for the requests that ask: rid ->
    (the token's log-probability, the top k with theirs)."""

    t: Literal["tokens"] = "tokens"
    writer: Name
    inc: Incarnation
    items: list[tuple[Name, Count, TokenId, Name]] = Field(max_length=MAX_ITEMS)
    logprobs: Annotated[dict[Name, tuple[Logprob, TopLogprobs]], Field(max_length=MAX_ITEMS)] = {}


class Done(_Msg):
    """A request ended at this subserver. n_out: its total number of output tokens."""

    t: Literal["done"] = "done"
    writer: Name
    inc: Incarnation
    rid: Name
    reason: Literal["stop", "length", "abort", "error"]
    n_out: Count
    written_by: Counts = {}
    error: Annotated[str, Field(max_length=8192)] | None = None


class Stats(_Msg):
    t: Literal["stats"] = "stats"
    to: Incarnation
    id: Count


class StatsReply(_Msg):
    t: Literal["stats_reply"] = "stats_reply"
    id: Count
    writer: Name
    inc: Incarnation
    stats: Annotated[dict[Name, Any], Field(max_length=256)]


class Shutdown(_Msg):
    t: Literal["shutdown"] = "shutdown"
    to: Incarnation


class Configure(_Msg):
    """Change a subserver's delayed-batching settings while it runs (a schedule never
    changes the tokens, so this is safe at any time)."""

    t: Literal["configure"] = "configure"
    to: Incarnation
    batch_threshold: int | None = Field(default=None, ge=1, le=1 << 16)
    max_wait_ms: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)


class DebugFail(_Msg):
    """Test hook: make the next `count` steps of this subserver raise, to prove that a
    failure inside a subserver ends its requests with an error instead of a hang. A
    subserver refuses it (drops and counts it) unless started with test hooks on
    (`SubserverSpec.test_hooks`, never set by `tokenrouter serve`)."""

    t: Literal["debug_fail"] = "debug_fail"
    to: Incarnation
    count: int = Field(default=1, ge=1, le=1000)


class DebugHold(_Msg):
    """Test hook: the decoding loop holds for `seconds` before it goes on, either computing
    (`busy`: a long step) or blocked without using the CPU (a deadlock that ends), to prove
    that the frontend tells the two apart. Refused without test hooks, as `debug_fail`."""

    t: Literal["debug_hold"] = "debug_hold"
    to: Incarnation
    seconds: float = Field(ge=0, le=600, allow_inf_nan=False)
    busy: bool = False


#: Messages that exist for the tests only.
TEST_ONLY = ("debug_fail", "debug_hold")

Message = Union[Submit, Announce, Release, Handoff, Resume, Ready, Heartbeat, Tokens, Done, Stats, StatsReply,
                Shutdown, Configure, DebugFail, DebugHold, Peers, PeerDown, Census]

#: What the frontend sends a subserver: each names the incarnation it is for (`to`).
TO_SUBSERVER = (Submit, Announce, Release, Resume, Stats, Shutdown, Configure, DebugFail, DebugHold, Peers,
                PeerDown)
#: What a subserver takes: each names the incarnation it is for (`to`).
ADDRESSED = (*TO_SUBSERVER, Handoff)
#: What a subserver sends the frontend: each names the sender (`writer`) and its incarnation (`inc`).
FROM_SUBSERVER = (Ready, Heartbeat, Tokens, Done, StatsReply, Census)


class WireError(ValueError):
    """A frame that is not a valid message of this wire version."""


_ADAPTER: TypeAdapter = TypeAdapter(Annotated[Message, Field(discriminator="t")])


def encode(msg: _Msg) -> bytes:
    return msg.model_dump_json().encode()


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; raise WireError with a readable reason otherwise."""
    if len(frame) > MAX_FRAME:
        raise WireError(f"frame of {len(frame)} bytes is over the {MAX_FRAME}-byte limit")
    try:
        data = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"frame is not JSON: {exc}") from None
    except RecursionError:  # nested deeper than the parser's guard: no message is
        raise WireError("frame is nested too deeply") from None
    if not isinstance(data, dict):
        raise WireError("frame is not a JSON object")
    if data.get("v") != CONTROL_VERSION:
        raise WireError(f"wire version {data.get('v')!r} is not {CONTROL_VERSION}")
    try:
        return _ADAPTER.validate_python(data)
    except RecursionError:
        raise WireError("frame is nested too deeply") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())[1:])
        raise WireError(f"invalid {str(data.get('t'))[:MAX_NAME]!r} message: {where}: {first['msg']}") from None
