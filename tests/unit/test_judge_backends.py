"""Judge backends against real sockets: a judge that is down is a clear failure, not a hang."""

from __future__ import annotations

import asyncio
import socket

import pytest

from clawrl.judge.backends import JudgeCallFailed, OpenAIJudge


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket closes


def test_judge_that_is_down_fails_the_call():
    judge = OpenAIJudge(f"http://127.0.0.1:{_closed_port()}/v1", "m", None, timeout_s=5)

    async def call():
        await judge.start()
        try:
            await judge.complete([{"role": "user", "content": "x"}], 0.0, 8)
        finally:
            await judge.stop()

    with pytest.raises(JudgeCallFailed, match="Connect"):
        asyncio.run(call())
