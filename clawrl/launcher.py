"""Start `clawrl serve` as a subprocess, wait until it answers, and stop it afterwards.

One launcher for everything that needs a real server: `clawrl eval` (a fresh server per
method), the tests and the benchmarks. The server is exactly what a user runs,

    python -m clawrl serve [--config <run>/config.json | --run-dir <run>] --server.port P [args...]

bound to 127.0.0.1 on a free port. Given a `Config`, the launcher writes it to the run folder
first (API keys travel as environment variables: config.json masks them), so the run keeps
the exact settings it was served with; later `args` override it as on the command line. The
server's console output goes to `<run>/logs/serve.out` (or `log_path`).

Starting waits for /healthz, failing at once with the log's tail if the process exits.
`stop()` sends SIGTERM, then SIGKILL after 30 s; it is safe to call twice, and leaving a
`with` block calls it.

    with ServerProcess(run_dir, ["--model", str(folder)]) as server:
        server.client().chat.completions.create(...)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from clawrl.net import free_port

if TYPE_CHECKING:
    from clawrl.config import Config

STOP_GRACE_S = 30.0  # SIGTERM, then SIGKILL after this long


class LaunchError(RuntimeError):
    """The server could not be started: it exited, never answered, or its run folder is taken."""


class ServerProcess:
    """`clawrl serve` in a subprocess on 127.0.0.1, from `run_dir` and CLI `args` (or a `config`).

    `off`: config sections (e.g. "train", "guard") started with `--<section>.enabled false`
    unless `args` name that option. `fresh`: refuse a run folder that holds a run already.
    `start_timeout_s` bounds the wait for /healthz; `request_timeout_s` is the default timeout
    of `health()` and of the clients. Attributes: `proc`, `port`, `url`, `run_dir`, `command`,
    `log_path` (and `log`, this side's handle on it), and `vllm_url`: the vLLM server behind this
    gateway (from its /healthz), or None.
    """

    def __init__(
        self,
        run_dir: Path,
        args: Sequence[str] = (),
        *,
        config: Config | None = None,
        env: Mapping[str, str] | None = None,
        off: Iterable[str] = (),
        fresh: bool = False,
        log_path: Path | None = None,
        cwd: Path | None = None,
        start_timeout_s: float = 600.0,
        request_timeout_s: float = 120.0,
    ) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_dir = Path(run_dir)
        self.request_timeout_s = request_timeout_s
        self.vllm_url: str | None = None
        if config is not None and Path(config.run_dir) != self.run_dir:
            raise ValueError(f"the config's run folder is {config.run_dir}, not {self.run_dir}")
        if fresh and (self.run_dir / "clawrl.db").exists():
            raise LaunchError(f"{self.run_dir} holds a run already; this server starts from a fresh folder")
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as `clawrl serve` makes it
        (self.run_dir / "logs").mkdir(exist_ok=True, mode=0o700)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or self.run_dir / "logs" / "serve.out"
        self.command = [sys.executable, "-m", "clawrl", "serve", *self._source(config)]
        self.command += ["--server.port", str(self.port), *args]
        for section in off:
            if f"--{section}.enabled" not in args:
                self.command += [f"--{section}.enabled", "false"]
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        child_env = {**os.environ, **_secrets(config), **(env or {})}
        try:
            self.proc = subprocess.Popen(
                self.command, stdout=self.log, stderr=subprocess.STDOUT, env=child_env, cwd=cwd
            )
            self._wait(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    @classmethod
    def from_config(cls, config: Config, args: Sequence[str] = (), **kw: Any) -> ServerProcess:
        """`clawrl serve --config <run>/config.json`: `config` written to its own run folder first."""
        return cls(config.run_dir, args, config=config, **kw)

    def _source(self, config: Config | None) -> list[str]:
        if config is None:
            return ["--run-dir", str(self.run_dir)]
        return ["--config", str(config.write())]

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LaunchError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                r = httpx.get(self.url + "/healthz", timeout=2)
            except httpx.HTTPError:
                r = None  # not listening yet
            if r is not None and r.status_code == 200:
                self.vllm_url = _vllm_url(r.json())
                return
            time.sleep(0.2)
        raise LaunchError(f"the server did not answer /healthz within {timeout_s:g} s:\n{self.tail()}")

    def output(self) -> str:
        """The server's console output so far."""
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        """The last lines of the server's console output."""
        return "\n".join(self.output().splitlines()[-lines:])

    def health(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The server's /healthz body (the same with 503, while the engine cannot serve)."""
        return dict(httpx.get(self.url + "/healthz", timeout=timeout_s or self.request_timeout_s).json())

    def engine_counters(self) -> dict[str, Any]:
        """What the engine did: /healthz's engine counters; behind vLLM, what vLLM's own /metrics
        say it ran and generated, beside the requests this gateway cancelled."""
        engine = dict(self.health()["engine"])
        if self.vllm_url is None:
            return engine
        counters = vllm_counters(self.vllm_url, self.request_timeout_s)
        return {**counters, "requests_cancelled": engine["requests_cancelled"]}

    def client(self, api_key: str = "unused", **kw: Any) -> Any:
        """An `openai.OpenAI` client of this server (no retries)."""
        from openai import OpenAI

        kw.setdefault("timeout", self.request_timeout_s)
        return OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def async_client(self, api_key: str = "unused", **kw: Any) -> Any:
        """An `openai.AsyncOpenAI` client of this server (no retries)."""
        from openai import AsyncOpenAI

        kw.setdefault("timeout", self.request_timeout_s)
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s); safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        log = getattr(self, "log", None)
        if log is not None and not log.closed:
            log.close()


def _secrets(config: Config | None) -> dict[str, str]:
    """The API keys of `config` as environment variables: config.json masks them."""
    if config is None:
        return {}
    from clawrl.config import API_KEY_ENV, JUDGE_KEY_ENV

    env = {}
    for name, secret in ((API_KEY_ENV, config.server.api_key), (JUDGE_KEY_ENV, config.judge.api_key)):
        if secret is not None:
            env[name] = secret.get_secret_value()
    return env


def _vllm_url(health: Any) -> str | None:
    """The vLLM server a gateway runs on, from its /healthz; None on the local engine."""
    try:
        url = health["engine"]["extra"]["vllm"]["url"]
    except (KeyError, TypeError):
        return None
    return url or None


def vllm_counters(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """vLLM's Prometheus counters at `url` under the names /healthz uses for the local engine."""
    totals: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=timeout_s).text.splitlines():
        if line.startswith("vllm:"):
            name, _, value = line.rpartition(" ")
            metric = name.split("{")[0]
            totals[metric] = totals.get(metric, 0.0) + float(value)
    return {
        "active": totals.get("vllm:num_requests_running", 0),
        "waiting": totals.get("vllm:num_requests_waiting", 0),
        "tokens_generated": totals.get("vllm:generation_tokens_total", 0),
        "steps": totals.get("vllm:iteration_tokens_total_count", 0),
    }
