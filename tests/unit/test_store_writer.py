"""StoreWriter: refused writes are kept in order, retried, bounded; other errors still raise."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from clawrl.store.errors import StoreBusy, StoreError, StoreUnwritable
from clawrl.store.writer import StoreWriter, WriterHealth
from tests.timing import limit


class FlakyTable:
    """A store stand-in that refuses writes while `refusing` names an error."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.refusing: Exception | None = None

    def insert(self, row: str) -> None:
        if self.refusing is not None:
            raise self.refusing
        self.rows.append(row)


def test_refused_writes_wait_in_order_then_land():
    async def scenario():
        table, writer = FlakyTable(), StoreWriter(retry_every_s=0.01, max_pending=3)
        await writer.write(table.insert, "a")
        table.refusing = StoreUnwritable("disk full")
        await writer.write(table.insert, "b")
        table.refusing = None
        await writer.write(table.insert, "c")  # the store would take it, but it waits behind "b"
        await writer.write(table.insert, "d")
        assert table.rows == ["a"] and writer.full
        assert writer.health() == WriterHealth(ok=False, error="disk full", pending_writes=3)

        table.refusing = StoreBusy("locked")
        writer.start()  # the retries begin
        async with asyncio.timeout(limit(10)):
            while writer.health().error != "locked":
                await asyncio.sleep(0.01)
        assert table.rows == ["a"]
        table.refusing = None
        await asyncio.wait_for(writer.settled(), limit(10))
        assert table.rows == ["a", "b", "c", "d"]
        assert writer.health() == WriterHealth(ok=True, error=None, pending_writes=0) and not writer.full
        await writer.stop()

    asyncio.run(scenario())


def test_other_store_errors_still_raise():
    async def scenario():
        table, writer = FlakyTable(), StoreWriter(retry_every_s=0.01, max_pending=3)
        table.refusing = StoreError("no such table")
        with pytest.raises(StoreError, match="no such table"):
            await writer.write(table.insert, "a")
        assert writer.health().pending_writes == 0
        await writer.stop()

    asyncio.run(scenario())


def test_whoever_sees_the_backlog_empty_sees_the_store_healthy():
    """The judge waits for `settled` and then reads `health`: the two must agree while the store
    thread drains. Drains many backlogs with a reader thread switching in as often as Python allows."""

    async def one_drain(caught: list[WriterHealth]) -> None:
        table, writer = FlakyTable(), StoreWriter(retry_every_s=0.01, max_pending=10)
        table.refusing = StoreBusy("locked")
        for row in "abc":
            await writer.write(table.insert, row)
        table.refusing = None
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                health = writer.health()
                if health.pending_writes == 0 and not health.ok:
                    caught.append(health)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            await writer.stop()  # drains the backlog on the store thread
        finally:
            done.set()
            reader.join()
        assert table.rows == ["a", "b", "c"]

    caught: list[WriterHealth] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(200):
            asyncio.run(one_drain(caught))
    finally:
        sys.setswitchinterval(interval)
    assert caught == []
