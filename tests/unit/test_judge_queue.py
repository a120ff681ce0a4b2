"""The judge's queue: the newest served version's turns first, arrival order within a version."""

from __future__ import annotations

import asyncio

from clawrl.judge.queue import JudgeQueue


def test_turns_under_a_newer_version_are_judged_first_and_none_is_dropped():
    async def run():
        q = JudgeQueue()
        for turn, version in [("a", 1), ("b", 1), ("c", 2), ("d", 0), ("e", 2), ("f", 1)]:
            q.put(turn, f"s-{turn}", version)
        assert q.qsize() == 6
        return [(await q.get())[0] for _ in range(6)], q.qsize()

    order, left = asyncio.run(run())
    # A steady stream under v2 goes before the backlog of v1 and v0, which is judged after, in order.
    assert order == ["c", "e", "a", "b", "f", "d"] and left == 0


def test_a_worker_waits_for_a_turn_and_wakes_on_put():
    async def run():
        q = JudgeQueue()
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        q.put("t1", "s1", 3)
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(run()) == ("t1", "s1")
