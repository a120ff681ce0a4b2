"""The server's one store thread, and what it does when the store refuses a write.

Every store call of the server (collect, judge, version watcher) runs on one
dedicated thread, so the event loop never waits on SQLite. The collector's
writes (a session opened or ended, a next state, a turn) and the judge's
(a judgment and its samples) go through `write`.

When the store refuses a write for a reason that passes (`StoreUnwritable`: the
disk is full, an I/O error; `StoreBusy`: another process held the database
lock past `collect.write_wait_s`), the write is kept in an in-memory backlog
and `write` returns as if it had landed: serving goes on. While the backlog
is not empty, later writes join its end without being tried, so they land in
the order they were made (a next state never arrives before its turn). Every
`collect.retry_every_s` the backlog is replayed in order; the first write
refused again ends that pass. `health()` (a `WriterHealth`) says so meanwhile:
`/healthz` shows `store: {"ok": false, ...}` with the error and the backlog's length.

The backlog holds at most `collect.max_pending_writes` writes: while it is
`full`, the API refuses new requests with a 503 and the OpenAI error body, so
no answer is served that could not be recorded. Writes of requests already
running are always kept. The judge waits (`settled`) while writes are kept, so
it never judges a turn that is not on disk yet. At shutdown the backlog is
tried once more; writes still refused then are lost, and the log says how many.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from clawrl.store.errors import StoreBusy, StoreUnwritable

log = logging.getLogger(__name__)
T = TypeVar("T")
TRANSIENT = (StoreUnwritable, StoreBusy)  # refusals that pass: disk space returns, a lock is released


@dataclass(frozen=True)
class WriterHealth:
    """What the store thread says of itself (`store` on /healthz)."""

    ok: bool  # no write kept for later, and the last write landed
    error: str | None  # why the store refuses writes (None while ok)
    pending_writes: int  # writes kept for later


class StoreWriter:
    def __init__(self, retry_every_s: float, max_pending: int) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clawrl-store")
        self._every = retry_every_s
        self._max = max_pending
        self._backlog: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()  # writer thread only
        self._error: str | None = None
        self._retry: asyncio.Task[None] | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the store thread (reads, and writes whose failure the caller handles)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def write(self, fn: Callable[..., Any], *args: Any) -> None:
        """Write now, or keep the write for later if the store refuses it for now (see the module)."""
        await self.run(self._write_or_keep, fn, args)

    @property
    def pending(self) -> int:
        """Writes kept for later."""
        return len(self._backlog)

    @property
    def full(self) -> bool:
        """The backlog holds `max_pending` writes: take no new work that would write."""
        return self.pending >= self._max

    async def settled(self) -> None:
        """Return once no write is kept for later (at once, normally)."""
        while self._backlog:
            await asyncio.sleep(self._every)

    def failed(self, exc: Exception) -> None:
        """Note a refusal seen by a caller that handles it itself (feedback)."""
        self._error = str(exc)

    def health(self) -> WriterHealth:
        pending = len(self._backlog)
        ok = pending == 0 and self._error is None
        return WriterHealth(ok, None if ok else self._error, pending)

    def start(self) -> None:
        self._retry = asyncio.create_task(self._retry_forever(), name="clawrl-store-retry")

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            await asyncio.gather(self._retry, return_exceptions=True)
        await self.run(self._drain)
        if self._backlog:
            log.error(
                "%d store writes are lost: still refused at shutdown (%s)", len(self._backlog), self._error
            )
        self._thread.shutdown(wait=True)

    async def _retry_forever(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            if self._backlog:
                await self.run(self._drain)

    def _write_or_keep(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if not self._backlog:
            try:
                fn(*args)
            except TRANSIENT as exc:
                self._refused(exc)
            else:
                self._error = None
                return
        self._backlog.append((fn, args))

    def _drain(self) -> None:
        while self._backlog:
            fn, args = self._backlog[0]
            try:
                fn(*args)
            except TRANSIENT as exc:
                self._refused(exc)
                return
            if len(self._backlog) == 1:
                self._recovered()  # before the last pop: whoever sees the backlog empty sees the error gone
            self._backlog.popleft()
        self._recovered()

    def _recovered(self) -> None:
        if self._error is not None:
            log.warning("the store takes writes again; every write kept meanwhile is recorded")
            self._error = None

    def _refused(self, exc: Exception) -> None:
        if self._error is None:
            log.error("the store refused a write; keeping writes in memory and retrying: %s", exc)
        self._error = str(exc)
