"""The supervisor of a vLLM server clawrl started (clawrl/engine/vllm/server.py), on the stand-in
(vllm_standin.py) in a process of its own: a server that stalls is counted down at once but
restarted only after `engine.vllm.unresponsive_s` of silence. Stalls are SIGSTOP: the process is
alive, its port open, and nothing answers, as a vLLM starved on a loaded machine or busy loading
weights in place."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from clawrl.config import VLLMConfig
from clawrl.engine.vllm.server import VLLMServer
from clawrl.net import free_port
from tests.timing import limit

SILENCE_S = 10.0  # unresponsive_s here: two /health checks time out (5 s each) before a restart


async def _until(check: Callable[[], bool], seconds: float, what: str) -> None:
    async with asyncio.timeout(limit(seconds)):
        while not check():
            await asyncio.sleep(0.05)


def test_a_stalled_vllm_is_counted_down_at_once_and_restarted_only_past_unresponsive_s(tmp_path, caplog):
    port = free_port()
    command = [sys.executable, "-m", "tests.service.vllm_standin", "--port", str(port)]
    config = VLLMConfig(require_key=False, health_poll_s=0.1, unresponsive_s=SILENCE_S, restart_backoff_s=0.1)
    server = VLLMServer(config, f"http://127.0.0.1:{port}", command=command, log_path=tmp_path / "vllm.log")

    async def scenario() -> None:
        await asyncio.to_thread(server.connect)
        await server.start()
        first = server._proc
        assert first is not None
        try:
            first.send_signal(signal.SIGSTOP)  # a stall shorter than unresponsive_s
            await _until(lambda: server.health.status == "down", 30, "the stall seen")
            first.send_signal(signal.SIGCONT)
            await _until(lambda: server.health.status == "ok", 30, "answering again")
            assert server.health.restarts == 0 and server._proc is first

            first.send_signal(signal.SIGSTOP)  # and one that outlasts it
            await _until(lambda: server.health.restarts == 1 and server.up, 60, "the restart")
            assert server._proc is not first and first.poll() is not None  # the stalled one killed
            assert server.health.last_exit == -signal.SIGKILL  # at once, not asked to stop for 30 s
        finally:
            if first.poll() is None:
                first.send_signal(signal.SIGCONT)
            await server.stop()

    caplog.set_level(logging.INFO, logger="clawrl")
    asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if r.name.startswith("clawrl")]
    assert sum("has not answered /health" in line for line in said) == 1, said  # why it was restarted
