"""Start a fresh `clawrl serve` for an evaluation, and stop it afterwards.

The server is a real subprocess, `python -m clawrl serve --config <run>/config.json
--server.port P`, bound to 127.0.0.1 on a free port: exactly what a user runs. The
resolved config is written to the fresh run folder first, so the run keeps the exact
settings it was served with. Its console output goes to `<run>/logs/serve.out`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from clawrl.eval.client import EvalError


def _env(config: Any) -> dict[str, str]:
    """The environment of the server: config.json masks API keys, so they travel as variables."""
    from clawrl.config import API_KEY_ENV, JUDGE_KEY_ENV

    env = dict(os.environ)
    for name, secret in ((API_KEY_ENV, config.server.api_key), (JUDGE_KEY_ENV, config.judge.api_key)):
        if secret is not None:
            env[name] = secret.get_secret_value()
    return env


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`clawrl serve` with `config` (a `clawrl.config.Config`) in a subprocess, until `stop()`."""

    def __init__(self, config: Any, start_timeout_s: float = 600.0) -> None:
        self.run_dir: Path = config.run_dir
        if (self.run_dir / "clawrl.db").exists():
            raise EvalError(f"{self.run_dir} holds a run already; an evaluation starts from a fresh folder")
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.config_path = config.write()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.run_dir / "logs" / "serve.out"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "clawrl", "serve", "--config", str(self.config_path)]
        cmd += ["--server.port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=_env(config))
        try:
            self._wait(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EvalError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.3)
        raise EvalError(f"the server did not answer /healthz within {timeout_s:g} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        """The last lines of the server's console output."""
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s); safe to call twice."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
