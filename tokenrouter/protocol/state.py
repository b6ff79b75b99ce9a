"""One request as one subserver knows it (`RouteState`), and its form on the wire when
it moves to another writer (`PeerMessage`, sent and received by `handoff.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

WIRE_VERSION = 1


@dataclass
class RouteState:
    """One request as one subserver knows it. Integers and lists only."""

    rid: str
    tokens: list[int]  # prompt + committed output, as far as known here
    prompt_len: int
    writer: str  # the writer of the request's next token
    visit_tokens: int = 0  # tokens `writer` has committed in its current visit
    seed: int = 0
    peer_read: dict[str, int] = field(default_factory=dict)  # peer -> len(tokens) it has seen
    written_by: dict[str, int] = field(default_factory=dict)  # writer -> tokens it wrote
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ... (opaque)
    finished: bool = False


class PeerMessage(BaseModel):
    """What crosses the wire on a handoff. Versioned, JSON-safe, no pickle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = WIRE_VERSION
    rid: str
    suffix: list[int]  # tokens[start:]
    start: int  # where the suffix begins in the full token list
    prompt_len: int
    writer: str  # who writes next (the receiver, or an ensemble it belongs to)
    visit_tokens: int = 0
    seed: int = 0
    written_by: dict[str, int] = {}
    sampling: dict[str, Any] = {}
    finished: bool = False
    sender: str = ""  # the model that sent it; the receiver records that it has read `start + len(suffix)`
