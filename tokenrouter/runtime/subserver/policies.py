"""The two choices that make a deployment this runtime or one of its baselines.

KV retention, what a subserver does with a request that departs to a peer:

- `KeepPending` (this runtime): the request stays here, `pending`. Its engine sequence
  keeps its KV blocks: the allocator hands out only free blocks and nothing frees a
  sequence but the frontend's `release`, so no pinning is needed. When it comes back its
  next step appends just the suffix it has not seen (invariant 1).
- `Rematch` (`no_pending`, `naive`): the request is forgotten here as a stock server
  would forget a finished one. Its KV goes into a prefix cache keyed by the tokens it
  holds, every handoff carries the whole context, and a request that arrives is matched
  against that cache like a new one: it takes over the longest cached prefix (the cache
  bookkeeping the TokenRouter paper measures) or starts from nothing.

Transport, the way a handoff travels:

- `PeerToPeer` (this runtime): straight to the next writer's subserver.
- `Relay` (`naive`): to the frontend, which forwards it as a dispatcher between
  independent servers would; subservers have no sockets to each other.

`baselines/naive.py` names the combinations; `LaunchOptions.retention` / `.transport`
(and `SubserverSpec`) carry the names, `retention_policy` / `transport_policy` make them.
"""

from __future__ import annotations

from typing import Callable

from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.transport.wire import FRONTEND

RETENTIONS = ("pending", "rematch")
TRANSPORTS = ("peer", "relay")


class KeepPending:
    name = "pending"

    def __init__(self, new_seq: Callable[[], int]):
        self.new_seq = new_seq

    def arrive(self, rid: str, tokens: list[int]) -> int:
        """The engine sequence of a request that has none here (new, or a first visit)."""
        return self.new_seq()

    def before_send(self, state: RouteState, dest: str) -> None:
        """The peer keeps what it has read: only the unseen suffix travels."""

    def keep(self, rid: str, seq: int, tokens: list[int]) -> bool:
        """A request departed having `tokens` in its KV: True keeps it here as pending."""
        return True

    def release(self, rid: str) -> None:
        """The request ended: free what this policy holds for it (nothing)."""


class Rematch:
    name = "rematch"

    def __init__(self, free: Callable[[int], None], new_seq: Callable[[], int]):
        self.free, self.new_seq = free, new_seq  # free: of one engine sequence, in every member
        self.cache: dict[tuple[int, ...], tuple[int, str]] = {}  # tokens in KV -> (sequence, request)

    def _free(self, seq: int) -> None:
        self.free(seq)

    def arrive(self, rid: str, tokens: list[int]) -> int:
        """Take over the longest cached sequence whose tokens prefix `tokens` (a fresh
        request's prefix match), or start a new one."""
        best = None
        for n in sorted({len(k) for k in self.cache}, reverse=True):
            if n < len(tokens):  # a step must feed at least one token
                key = tuple(tokens[:n])
                if key in self.cache:
                    best = key
                    break
        seq = self.cache.pop(best)[0] if best is not None else self.new_seq()
        self.release(rid)  # at most one sequence per request and engine
        return seq

    def before_send(self, state: RouteState, dest: str) -> None:
        state.peer_read[dest] = 0  # the whole context travels, as to an independent server

    def keep(self, rid: str, seq: int, tokens: list[int]) -> bool:
        key = tuple(tokens)
        old = self.cache.get(key)
        if old is not None and old[0] != seq:  # an identical context is cached: keep one
            self._free(old[0])
        self.cache[key] = (seq, rid)
        return False

    def release(self, rid: str) -> None:
        for key, (seq, owner) in list(self.cache.items()):
            if owner == rid:
                self._free(seq)
                del self.cache[key]


class PeerToPeer:
    name = "peer"

    def peers(self, me: str, addresses: dict[str, str]) -> dict[str, str]:
        """The endpoints a subserver sends to: the frontend and every other writer."""
        return {n: a for n, a in addresses.items() if n != me}

    def hop(self, dest: str) -> str:
        """Where a handoff to `dest` is sent."""
        return dest


class Relay:
    name = "relay"

    def peers(self, me: str, addresses: dict[str, str]) -> dict[str, str]:
        return {FRONTEND: addresses[FRONTEND]}

    def hop(self, dest: str) -> str:
        return FRONTEND


def retention_policy(name: str, engine, new_seq: Callable[[], int]) -> KeepPending | Rematch:
    """The policy `name` over the writer's engine (`rematch` frees its sequences: tokenrouter's engine only)."""
    if name == "pending":
        return KeepPending(new_seq)
    if name == "rematch":
        if not hasattr(engine, "free"):
            raise ValueError(f"KV retention 'rematch' needs tokenrouter's engine; {type(engine).__name__} keeps "
                             "requests pending")
        return Rematch(engine.free, new_seq)
    raise ValueError(f"KV retention {name!r} is not one of {', '.join(RETENTIONS)}")


def transport_policy(name: str) -> PeerToPeer | Relay:
    kinds = {"peer": PeerToPeer, "relay": Relay}
    if name not in kinds:
        raise ValueError(f"transport {name!r} is not one of {', '.join(TRANSPORTS)}")
    return kinds[name]()
