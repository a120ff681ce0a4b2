"""Stand-in vLLM servers (vllm_standin.py) as processes a test starts, kills and starts again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from clawrl.net import free_port
from tests.conftest import ROOT
from tests.timing import wait_for


class StandInProcess:
    """One stand-in on a port of its own, which it keeps across restarts."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_dir / f"standin-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, **settings: Any) -> None:
        """Start it (again) on its port; `settings`: the test hooks' (vllm_standin.py) from the start."""
        command = [sys.executable, "-m", "tests.service.vllm_standin", "--port", str(self.port)]
        with open(self._log, "ab") as out:
            self.proc = subprocess.Popen(
                [*command, "--config", json.dumps(settings)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._answers, 60, f"the stand-in at {self.url}")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the stand-in exited: {self._log.read_text()[-2000:]}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def configure(self, **settings: Any) -> None:
        httpx.post(self.url + "/standin/config", json=settings, timeout=10).raise_for_status()

    def log(self, kind: str = "completion") -> list[dict[str, Any]]:
        entries = httpx.get(self.url + "/standin/log", timeout=10).json()
        return [e for e in entries if e["kind"] == kind]
