"""KV admission control at the frontend: no request starts unless its KV blocks are free.

A pending request keeps its blocks at the writers it left, so running out of blocks in
the middle of requests could deadlock them all. A request therefore reserves
`blocks_needed(prompt, max_tokens, block_size)` = ceil((prompt + max_tokens) /
block_size) + 1 blocks of the smallest cache before it is submitted, waits while they are
not free, and gives them back when it ends (after its `release` went out). Waiters are
woken in the order they came and each takes its blocks once they fit, so a request that
fits now goes ahead of a larger one still waiting (not strictly FIFO). A request that
could never fit is refused by the caller (HTTP 400), not queued here.
"""

from __future__ import annotations

import asyncio
import math
from typing import Callable

__all__ = ["KvAdmission", "blocks_needed"]


def blocks_needed(prompt_len: int, max_tokens: int, block_size: int) -> int:
    """The KV blocks a request reserves."""
    return math.ceil((prompt_len + max_tokens) / max(1, block_size)) + 1


class KvAdmission:
    """Reservations of KV blocks against `capacity` (the smallest cache's blocks, set when
    the runtime has started). `healthy()` says whether the runtime can take requests: a
    waiter gives up when it cannot (`reserve` returns False); whoever changes the health
    calls `wake` so the waiters look again."""

    def __init__(self, healthy: Callable[[], bool]):
        self.healthy = healthy
        self.capacity = 0
        self.reserved = 0
        self.queued = 0  # requests waiting for blocks now
        self._cond = asyncio.Condition()

    async def reserve(self, blocks: int) -> bool:
        """Wait until `blocks` are free and hold them (True), or until the runtime is no
        longer healthy (False, nothing held). A request that fits does not wait behind one
        that does not."""
        async with self._cond:
            self.queued += 1
            try:
                await self._cond.wait_for(lambda: self.reserved + blocks <= self.capacity or not self.healthy())
            finally:
                self.queued -= 1
            if not self.healthy():
                return False
            self.reserved += blocks
            return True

    async def release(self, blocks: int) -> None:
        """Give back blocks a request held; the waiters look again."""
        async with self._cond:
            self.reserved -= blocks
            self._cond.notify_all()

    async def wake(self) -> None:
        """The runtime's health changed: the waiters look again."""
        async with self._cond:
            self._cond.notify_all()
