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
refuse it, `sockets.py`). A frame that fails is dropped by the receiver and counted
(`tokenrouter_frames_dropped_total`).

Directions:
  frontend -> subserver: submit, announce, release, stats, shutdown, configure, debug_fail
  subserver -> subserver: handoff
  subserver -> frontend:  ready, tokens, done, handoff (`relay` transport only), stats_reply
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

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


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    v: int = CONTROL_VERSION


class Submit(_Msg):
    """A new request for the start writer's subserver."""

    t: Literal["submit"] = "submit"
    rid: Name
    prompt: list[TokenId] = Field(min_length=1, max_length=MAX_TOKENS)
    sampling: SamplingParams = SamplingParams()
    route_seed: Seed = 0  # the seed of the program's coin flips (`protocol.state`)


class Announce(_Msg):
    """A request now exists in the system (sent to every subserver but the start one), so
    delayed batching knows how many requests could still arrive."""

    t: Literal["announce"] = "announce"
    rid: Name


class Release(_Msg):
    """The request ended (finished, aborted or failed): free its KV and forget it."""

    t: Literal["release"] = "release"
    rid: Name
    reason: Name = "finished"


class Handoff(_Msg):
    """A request moves to the receiving writer. `sender` is the writer that sent it."""

    t: Literal["handoff"] = "handoff"
    sender: Name
    dest: Name
    msg: PeerMessage

    @field_validator("msg")
    @classmethod
    def _bounded(cls, m: PeerMessage) -> PeerMessage:
        """`PeerMessage` (`protocol.state`) types its seed and sampling parameters but leaves
        names, token ids and positions loose; a peer's handoff is held to the same bounds as
        a submit."""
        if len(m.rid) > MAX_NAME or len(m.writer) > MAX_NAME or len(m.sender) > MAX_NAME:
            raise ValueError("a name is too long")
        if len(m.suffix) > MAX_TOKENS or any(not 0 <= t <= TOKEN_ID_MAX for t in m.suffix):
            raise ValueError("suffix too long or a token id out of range")
        for v in (m.start, m.prompt_len, m.visit_tokens):
            if not 0 <= v <= MAX_TOKENS * 2:
                raise ValueError(f"a position ({v}) is out of range")
        if len(m.written_by) > 256 or any(len(k) > MAX_NAME or not 0 <= n <= TOKEN_ID_MAX
                                          for k, n in m.written_by.items()):
            raise ValueError("written_by is out of bounds")
        return m


class Ready(_Msg):
    """A subserver has loaded its engines and is serving."""

    t: Literal["ready"] = "ready"
    writer: Name
    pid: Count
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
    does not delay it); the frontend declares a subserver down when it hears nothing from
    it for its heartbeat timeout. `pid` tells a restarted process from the old one."""

    t: Literal["heartbeat"] = "heartbeat"
    writer: Name
    pid: Count


Logprob = Annotated[float, Field(ge=-1e9, le=0.0, allow_inf_nan=False)]
TopLogprobs = Annotated[list[tuple[TokenId, Logprob]], Field(max_length=MAX_LOGPROBS)]


class Tokens(_Msg):
    """Tokens committed in one step: items are [rid, output position, token id]; `logprobs`,
    for the requests that ask: rid -> (the token's log-probability, the top k with theirs)."""

    t: Literal["tokens"] = "tokens"
    writer: Name
    items: list[tuple[Name, Count, TokenId]] = Field(max_length=MAX_ITEMS)
    logprobs: Annotated[dict[Name, tuple[Logprob, TopLogprobs]], Field(max_length=MAX_ITEMS)] = {}


class Done(_Msg):
    """A request ended at this subserver. n_out: its total number of output tokens."""

    t: Literal["done"] = "done"
    rid: Name
    reason: Literal["stop", "length", "abort", "error"]
    n_out: Count
    written_by: Counts = {}
    error: Annotated[str, Field(max_length=8192)] | None = None


class Stats(_Msg):
    t: Literal["stats"] = "stats"
    id: Count


class StatsReply(_Msg):
    t: Literal["stats_reply"] = "stats_reply"
    id: Count
    writer: Name
    stats: Annotated[dict[Name, Any], Field(max_length=256)]


class Shutdown(_Msg):
    t: Literal["shutdown"] = "shutdown"


class Configure(_Msg):
    """Change a subserver's delayed-batching settings while it runs (a schedule never
    changes the tokens, so this is safe at any time)."""

    t: Literal["configure"] = "configure"
    batch_threshold: int | None = Field(default=None, ge=1, le=1 << 16)
    max_wait_ms: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)


class DebugFail(_Msg):
    """Test hook: make the next `count` steps of this subserver raise, to prove that a
    failure inside a subserver ends its requests with an error instead of a hang. A
    subserver refuses it (drops and counts it) unless started with test hooks on
    (`SubserverSpec.test_hooks`, never set by `tokenrouter serve`)."""

    t: Literal["debug_fail"] = "debug_fail"
    count: int = Field(default=1, ge=1, le=1000)


#: Messages that exist for the tests only.
TEST_ONLY = ("debug_fail",)

Message = Union[Submit, Announce, Release, Handoff, Ready, Heartbeat, Tokens, Done, Stats, StatsReply,
                Shutdown, Configure, DebugFail]


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
    if not isinstance(data, dict):
        raise WireError("frame is not a JSON object")
    if data.get("v") != CONTROL_VERSION:
        raise WireError(f"wire version {data.get('v')!r} is not {CONTROL_VERSION}")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())[1:])
        raise WireError(f"invalid {str(data.get('t'))[:MAX_NAME]!r} message: {where}: {first['msg']}") from None
