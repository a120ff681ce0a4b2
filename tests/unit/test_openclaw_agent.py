"""`run_agent_async`: one `openclaw agent --local` turn on an event loop, cancellable.

A stand-in agent (a Python script where the launcher would be) prints what OpenClaw's `--json`
prints, or hangs: what matters here is the process, which the real agent's tests
(tests/client/test_openclaw.py) cannot stop mid-turn on purpose."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawrl.eval.openclaw import run_agent_async

REPLY = '{"payloads": [{"text": "Paris."}], "meta": {"stopReason": "stop", "durationMs": 1200}}'


def fake_agent(tmp_path: Path, body: str) -> Path:
    """An executable that records its pid, its HOME and its arguments, then runs `body`."""
    path = tmp_path / "openclaw"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time, pathlib\n"
        f"pathlib.Path({str(tmp_path / 'pid')!r}).write_text(f'{{os.getpid()}} {{os.environ[\"HOME\"]}} '"
        " + ' '.join(sys.argv[1:]))\n" + body
    )
    path.chmod(0o755)
    return path


def test_a_turn_is_read_from_what_the_agent_prints(tmp_path):
    agent = fake_agent(tmp_path, f"print('[agent] starting'); print({REPLY!r})\n")
    turn = asyncio.run(run_agent_async(agent, tmp_path / "home", "s1", "Capital of France?", 30))
    assert (turn.text, turn.stop_reason, turn.duration_s) == ("Paris.", "stop", 1.2)
    _, home, *args = (tmp_path / "pid").read_text().split(" ", 2)
    assert home == str(tmp_path / "home")
    assert args == ["agent --local --session-id s1 --message Capital of France? --json"]


def test_a_failed_turn_raises_with_the_agents_output(tmp_path):
    agent = fake_agent(tmp_path, "print('Context overflow'); sys.exit(3)\n")
    with pytest.raises(RuntimeError, match="openclaw exited 3:\nContext overflow"):
        asyncio.run(run_agent_async(agent, tmp_path, "s1", "hi", 30))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cancelling_a_turn_kills_the_agent_at_once(tmp_path):
    """An eval that ends cancels its users' turns: the agent must not run on (a thread running the
    blocking call would hold the event loop's shutdown for up to the turn's timeout)."""
    agent = fake_agent(tmp_path, "time.sleep(600)\n")

    async def cancel_mid_turn() -> float:
        turn = asyncio.create_task(run_agent_async(agent, tmp_path, "s1", "hi", 600))
        while not (tmp_path / "pid").exists():
            await asyncio.sleep(0.01)
        start = time.monotonic()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        return time.monotonic() - start

    took = asyncio.run(cancel_mid_turn())
    assert took < 10 and _gone(int((tmp_path / "pid").read_text().split()[0]))


def test_a_turn_past_its_timeout_is_killed(tmp_path):
    agent = fake_agent(tmp_path, "time.sleep(600)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        asyncio.run(run_agent_async(agent, tmp_path, "s1", "hi", 1.0))
    assert _gone(int((tmp_path / "pid").read_text().split()[0]))
