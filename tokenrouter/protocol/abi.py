"""The contract between generated router modules and the runtime that calls them.

A subserver steps its engine on a batch, samples one token per request, then calls the
compiled `route` of its model once for the whole batch:

    decisions = router.route(step)      # CPU int64 tensor [2, B]: the one D2H copy
    dest, keep = decisions[0], decisions[1]

`dest[i]` is an index into `plan.writers` (the writer's own index means "stay"); `keep[i]`
is 1 when the sampled token is committed, 0 when it is rewritten (dropped: the
destination writes that position instead). For a request that stays, keep is always 1.

When a request leaves, the runtime calls `router.send(state, peer)` to build the message
for the peer subserver, and the peer calls `receive(msg, state_or_None)`. Only the token
suffix the peer has not seen travels (`RouteState.peer_read`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

WIRE_VERSION = 1


@dataclass
class FeatureNeeds:
    """What a model's compiled router reads besides the logits, so the engine computes
    only that. Layers use `ir.InputHidden` numbering (-1 = after the final norm)."""

    hidden_layers: tuple[int, ...] = ()
    token_embedding: bool = False


@dataclass
class StepTensors:
    """One step of one model (or ensemble) for a batch of B requests, on the model's device.

    logits: [B, V] last-position logits (float32/64); for an ensemble writer,
        `member_logits` holds each member's logits in `Ensemble.members` order instead.
    sampled: [B] int64, the token each request sampled this step.
    hidden: {layer: [B, H]} for the layers in `needs.hidden_layers`.
    token_embedding: [B, H] input embedding of `sampled`, when `needs.token_embedding`.
    visit_tokens: [B] int64, tokens this writer produced in the current visit, counting
        the one just sampled.
    position: [B] int64, index of the sampled token among the request's output tokens.
    request_seed: [B] int64, the request's seed (for seeded features).
    """

    logits: Any
    sampled: Any
    visit_tokens: Any
    position: Any
    request_seed: Any
    hidden: dict[int, Any] = field(default_factory=dict)
    token_embedding: Any = None
    member_logits: tuple[Any, ...] = ()


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
