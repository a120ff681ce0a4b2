"""The eval's client against a real socket that takes a request and never answers."""

from __future__ import annotations

import asyncio
import socket

import pytest

from clawrl.eval.client import EvalClient, ServerUnreachable, Unanswered


def test_a_chat_request_that_times_out_is_one_unanswered_turn_not_the_end_of_the_eval():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    port = silent.getsockname()[1]

    async def ask() -> EvalClient:
        client = EvalClient(f"http://127.0.0.1:{port}", None, timeout_s=0.5)
        async with client:
            with pytest.raises(Unanswered, match="no answer in 0.5 s"):
                await client.chat([{"role": "user", "content": "hi"}], "s1", temperature=0.0, max_tokens=4)
        return client

    try:
        assert asyncio.run(ask()).unanswered == 1
    finally:
        silent.close()


def test_a_server_that_is_not_there_still_stops_the_eval():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    # the port is closed now: the connection is refused, which no waiting mends

    async def ask() -> None:
        async with EvalClient(f"http://127.0.0.1:{port}", None) as client:
            await client.chat([{"role": "user", "content": "hi"}], "s1", temperature=0.0, max_tokens=4)

    with pytest.raises(ServerUnreachable):
        asyncio.run(ask())
