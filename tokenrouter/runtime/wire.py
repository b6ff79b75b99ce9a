"""The messages that cross a ZeroMQ socket between the frontend and subservers.

Every frame is one JSON object with a wire version `v` and a type `t`. A handoff carries an
`abi.PeerMessage` (the only message that moves a request between models); the rest are
small control messages defined here. Nothing is ever pickled: a frame from another host
is data, validated by pydantic on the way in, and a frame of an unknown type or version is
rejected with a clear error instead of being executed.

Directions:
  frontend -> subserver: submit, announce, release, stats, shutdown, configure, debug_fail
  subserver -> subserver: handoff
  subserver -> frontend:  ready, tokens, done, handoff (relay mode only), stats_reply
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tokenrouter.compiler.abi import PeerMessage

CONTROL_VERSION = 1


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    v: int = CONTROL_VERSION


class Submit(_Msg):
    """A new request for the start writer's subserver."""

    t: Literal["submit"] = "submit"
    rid: str
    prompt: list[int]
    sampling: dict[str, Any] = {}  # temperature, top_k, top_p, seed, max_tokens, stop_token_ids
    seed: int = 0


class Announce(_Msg):
    """A request now exists in the system (sent to every subserver but the start one), so
    delayed batching knows how many requests could still arrive."""

    t: Literal["announce"] = "announce"
    rid: str


class Release(_Msg):
    """The request ended (finished, aborted or failed): free its KV and forget it."""

    t: Literal["release"] = "release"
    rid: str
    reason: str = "finished"


class Handoff(_Msg):
    """A request moves to the receiving writer. `sender` is the writer that sent it."""

    t: Literal["handoff"] = "handoff"
    sender: str
    dest: str
    msg: PeerMessage


class Ready(_Msg):
    """A subserver has loaded its engines and is serving."""

    t: Literal["ready"] = "ready"
    writer: str
    pid: int
    block_size: int
    blocks_total: int
    max_model_len: int
    vocab_size: int
    threads: int
    batch_threshold: int
    max_wait_ms: float
    error: str | None = None  # set when start-up failed; the subserver then exits


class Tokens(_Msg):
    """Tokens committed in one step: items are [rid, output position, token id]."""

    t: Literal["tokens"] = "tokens"
    writer: str
    items: list[tuple[str, int, int]]


class Done(_Msg):
    """A request ended at this subserver. n_out: its total number of output tokens."""

    t: Literal["done"] = "done"
    rid: str
    reason: Literal["stop", "length", "abort", "error"]
    n_out: int
    written_by: dict[str, int] = {}
    error: str | None = None


class Stats(_Msg):
    t: Literal["stats"] = "stats"
    id: int


class StatsReply(_Msg):
    t: Literal["stats_reply"] = "stats_reply"
    id: int
    writer: str
    stats: dict[str, Any]


class Shutdown(_Msg):
    t: Literal["shutdown"] = "shutdown"


class Configure(_Msg):
    """Change a subserver's delayed-batching settings while it runs (a schedule never
    changes the tokens, so this is safe at any time)."""

    t: Literal["configure"] = "configure"
    batch_threshold: int | None = Field(default=None, ge=1)
    max_wait_ms: float | None = Field(default=None, ge=0)


class DebugFail(_Msg):
    """Test hook: make the next `count` steps of this subserver raise, to prove that a
    failure inside a subserver ends its requests with an error instead of a hang."""

    t: Literal["debug_fail"] = "debug_fail"
    count: int = 1


Message = Union[Submit, Announce, Release, Handoff, Ready, Tokens, Done, Stats, StatsReply,
                Shutdown, Configure, DebugFail]


class WireError(ValueError):
    """A frame that is not a valid message of this wire version."""


_ADAPTER: TypeAdapter = TypeAdapter(Annotated[Message, Field(discriminator="t")])


def encode(msg: _Msg) -> bytes:
    return msg.model_dump_json().encode()


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; raise WireError with a readable reason otherwise."""
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
        raise WireError(f"invalid {data.get('t')!r} message: {exc.errors()[0]['msg']}") from None
