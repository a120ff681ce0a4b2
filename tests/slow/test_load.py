"""Load on the embedded model: 24 streaming clients plus 8 that hang up mid-stream.

Thirty-two requests for the engine's 16 batch slots: they queue, and slots free as clients leave.
(bench/load.py runs the same at 64 + 16 and reports its times: docs/benchmarks.md.)

What a user would see: every client that stays gets its whole answer (no failures), the
ones that leave free their slots, every request is in the store afterwards (the cut-off ones
too, as `abort` or finished turns), and the server's memory comes back to where it started.
"""

from __future__ import annotations

import asyncio

import pytest

from clawrl.eval.load import run_load
from clawrl.store.db import Store
from tests.conftest import RemoteServer
from tests.timing import limit, wait_for

pytestmark = pytest.mark.slow

STAYING, LEAVING, MAX_TOKENS = 24, 8, 16


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _turns(server: RemoteServer) -> list:
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return list(store.turns())


def _idle(server: RemoteServer) -> bool:
    engine = server.health()["engine"]
    return engine["active"] == 0 and engine["waiting"] == 0


def test_24_streams_and_8_hang_ups_lose_nothing(tmp_path):
    server = RemoteServer(tmp_path / "run", ["--judge.enabled", "false"])
    try:
        url = server.url + "/v1"
        asyncio.run(run_load(url, 1, 0, MAX_TOKENS, timeout=limit(600)))  # one answer: the model is warm
        wait_for(lambda: _idle(server), limit(120), "the engine to go idle after the first answer")
        before_turns = len(_turns(server))
        start_mb = _rss_mb(server.own_pid())

        result = asyncio.run(run_load(url, STAYING, LEAVING, MAX_TOKENS, timeout=limit(600)))
        assert result.failures == []
        assert result.completed == STAYING and len(result.ttft_s) == STAYING
        assert result.left == LEAVING

        wait_for(lambda: _idle(server), limit(120), "the engine to go idle after the load")
        wait_for(
            lambda: len(_turns(server)) == before_turns + STAYING + LEAVING,
            limit(60),
            "every request of the load to be in the store",
        )
        turns = _turns(server)[before_turns:]
        finished = [t for t in turns if t.finish_reason == "length"]
        assert len(finished) >= STAYING and all(len(t.response_ids) == MAX_TOKENS for t in finished)
        assert _rss_mb(server.own_pid()) <= 1.10 * start_mb
    finally:
        server.stop()
