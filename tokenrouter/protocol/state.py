"""One request as one subserver knows it (`RouteState`), and its form on the wire when
it moves to another writer (`PeerMessage`, sent and received by `handoff.py`).

A request carries two seeds, for two different things:

- `route_seed` seeds the coin flips of the routing program (`bernoulli(...)` rules, a
  mixture's draws; `StepTensors.request_seed` in a step): the frontend takes it from the
  request (the HTTP body's `seed`, the offline API's `route_seeds`, the bench's request
  index), and a request that gives none gets `route_seed_of(rid)`, so different requests
  flip independent coins;
- `sampling.seed` (`sampling.SamplingParams`) seeds the sampler's draws.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from tokenrouter.protocol.sampling import SamplingParams, Seed

WIRE_VERSION = 1

__all__ = ["PeerMessage", "RouteState", "WIRE_VERSION", "route_seed_of"]


def route_seed_of(rid: str) -> int:
    """The route seed of a request that gives none: a stable 63-bit hash of its id
    (BLAKE2b), the same for the same id on every host and in every run."""
    digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class RouteState:
    """One request as one subserver knows it: integers and lists, and its `SamplingParams`."""

    rid: str
    tokens: list[int]  # prompt + committed output, as far as known here
    prompt_len: int
    writer: str  # the writer of the request's next token
    visit_tokens: int = 0  # tokens `writer` has committed in its current visit
    route_seed: int = 0  # seeds the program's coin flips (not the sampler: that is sampling.seed)
    peer_read: dict[str, int] = field(default_factory=dict)  # peer -> len(tokens) it has seen
    written_by: dict[str, int] = field(default_factory=dict)  # writer -> tokens it wrote
    sampling: SamplingParams = field(default_factory=SamplingParams)  # immutable: shared, never copied
    finished: bool = False
    hops: int = 0  # handoffs the request has made so far: orders its copies when a writer's process dies


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
    route_seed: Seed = 0
    written_by: dict[str, int] = {}
    sampling: SamplingParams = SamplingParams()
    finished: bool = False
    sender: str = ""  # the model that sent it; the receiver records that it has read `start + len(suffix)`
    hops: int = 0  # the request's handoffs including this one (a receiver ignores a message it has seen)
