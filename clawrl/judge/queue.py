"""The order turns are judged in: the newest served version's first, in arrival order within one.

A judge slower than the traffic (a local judge on a busy 2-core engine votes ~9 turns a minute
while a steady user makes ~17) can never catch up. First in, first out, every judgment is then
older than the last and its samples come out more than `train.max_staleness` versions behind:
the trainer gets nothing fresh and stops publishing (docs/evaluation.md saw it stall at v6 with
78 samples stale). So a turn submitted while vN is served goes before every turn submitted under
an older version; within one version, first come first judged, so a session's turns and a
group's episodes keep their order. Older turns are judged whenever nothing newer waits: nothing
is dropped, and a restart queues whatever was left (store.turns_awaiting_judgment).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class JudgeQueue:
    """An asyncio queue of (turn id, session id) taken newest served version first."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str, str]] = []
        self._seq = itertools.count()
        self._ready = asyncio.Event()

    def put(self, turn_id: str, session_id: str, version: int) -> None:
        """Queue a turn submitted while version `version` (vN's N) was served."""
        heapq.heappush(self._heap, (-version, next(self._seq), turn_id, session_id))
        self._ready.set()

    async def get(self) -> tuple[str, str]:
        while not self._heap:
            self._ready.clear()
            await self._ready.wait()
        _, _, turn_id, session_id = heapq.heappop(self._heap)
        return turn_id, session_id

    def qsize(self) -> int:
        return len(self._heap)
