"""Shared fixtures: a tiny random model with the real tokenizer, and live servers.

`RemoteServer` starts `python -m clawrl serve` as a real subprocess on a free
127.0.0.1 port and waits for /healthz, as a user would run it.

Engines: `tiny_server` runs on the `engine` fixture, "local" unless a module
parametrises it with `BOTH_ENGINES`. On "local" the gateway serves the tiny
random model itself; on "vllm" it attaches to the session's ONE vLLM server
(`vllm_gateway`: a gateway started with `--engine.vllm.start true`, 25-60 s,
from the venv scripts/setup-vllm installs once) serving the embedded SmolLM2
with the tiny model's 512-token window, so the same limits hold. The vLLM tests
skip only when the package registry cannot be reached to install vLLM.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clawrl.eval.server import free_port
from tests.timing import limit

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 512  # the tiny model's window; the session's vLLM server serves the same
BOTH_ENGINES = pytest.mark.parametrize("engine", ["local", "vllm"], scope="module")


class RemoteServer:
    """`clawrl serve` in a subprocess, bound to 127.0.0.1 on a free port."""

    def __init__(
        self,
        run_dir: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
        vllm_url: str | None = None,
    ) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.vllm_url = vllm_url  # the vLLM server behind this gateway, if any
        if "--train.enabled" not in args:  # the trainer process is tested where it matters; elsewhere it
            args = [*args, "--train.enabled", "false"]  # would only add a torch import per server
        if "--guard.enabled" not in args:  # a tiny random model has no general skill for the canary to
            args = [*args, "--guard.enabled", "false"]  # guard; tests/service/test_guard.py turns it on
        cmd = [
            sys.executable,
            "-m",
            "clawrl",
            "serve",
            "--run-dir",
            str(run_dir),
            "--server.port",
            str(self.port),
            *args,
        ]
        self.log = open(run_dir.parent / f"{run_dir.name}.out", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT
        )
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        timeout = limit(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server did not start in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return (self.run_dir.parent / f"{self.run_dir.name}.out").read_text()

    def health(self) -> dict:
        return httpx.get(self.url + "/healthz", timeout=limit(10)).json()

    def engine_counters(self) -> dict:
        """What the engine did: /healthz's engine counters; behind vLLM, what vLLM's own /metrics
        say it ran and generated, beside the requests this gateway cancelled."""
        engine = self.health()["engine"]
        if self.vllm_url is None:
            return engine
        return {**vllm_counters(self.vllm_url), "requests_cancelled": engine["requests_cancelled"]}

    def client(self, api_key: str = "unused", **kw):
        from openai import OpenAI

        kw.setdefault("timeout", limit(60))
        return OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def async_client(self, api_key: str = "unused"):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=limit(120))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def vllm_counters(url: str) -> dict:
    """vLLM's Prometheus counters under the names /healthz uses for the local engine."""
    totals: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=limit(10)).text.splitlines():
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


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The python of vLLM's venv, installed once into the cache folder by scripts/setup-vllm."""
    proc = subprocess.run([str(ROOT / "scripts" / "setup-vllm")], capture_output=True, text=True)
    if proc.returncode == 75:
        pytest.skip(f"vLLM cannot be installed here: {proc.stderr.strip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/setup-vllm failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def vllm_args(model_dir: Path, *more: str) -> list[str]:
    """`clawrl serve` arguments for a gateway on vLLM serving `model_dir` in a CONTEXT-token window."""
    return ["--model", str(model_dir), "--model.max-context", str(CONTEXT), "--engine.kind", "vllm", *more]


@pytest.fixture(scope="session")
def vllm_gateway(vllm_python, embedded_model_dir, tmp_path_factory) -> RemoteServer:
    """The session's ONE vLLM server, started and supervised the way a user starts it: by a gateway
    with `--engine.vllm.start true` (this gateway; other gateways attach to its vLLM)."""
    run_dir = tmp_path_factory.mktemp("vllm-owner") / "run"
    start = ["--engine.vllm.start", "true", "--engine.vllm.python", vllm_python, "--judge.enabled", "false"]
    server = RemoteServer(run_dir, vllm_args(embedded_model_dir, *start), timeout=300)
    server.vllm_url = server.health()["engine"]["extra"]["vllm"]["url"]
    yield server
    server.stop()


def attach_gateway(run_dir: Path, vllm_gateway: RemoteServer, model_dir: Path, *args: str) -> RemoteServer:
    """A gateway attached to the session's vLLM server, with its own run folder and store."""
    url = vllm_gateway.vllm_url
    assert url is not None
    more = ["--engine.vllm.url", url, "--judge.enabled", "false", *args]
    return RemoteServer(run_dir, vllm_args(model_dir, *more), vllm_url=url)


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The converted embedded SmolLM2 folder (converted once into the user cache)."""
    from clawrl.config import Config
    from clawrl.engine.models import ensure_embedded

    return ensure_embedded(Config().cache_dir())


def make_tiny_model(out: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer random Llama with a real tokenizer and chat template (512-token context), saved in `out`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """SmolLM2's real tokenizer on a tiny random model: fast tests that still tokenise for real."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), embedded_model_dir)


@pytest.fixture(scope="module")
def engine() -> str:
    """The engine behind `tiny_server`: "local", unless a module parametrises it (BOTH_ENGINES)."""
    return "local"


@pytest.fixture(scope="module")
def tiny_server(request: pytest.FixtureRequest, engine: str, tmp_path_factory, tiny_model_dir: Path):
    """A gateway on `engine`: the tiny model served locally, or SmolLM2 on the session's vLLM."""
    run_dir = tmp_path_factory.mktemp(f"srv-{engine}") / "run"
    if engine == "vllm":
        vllm = request.getfixturevalue("vllm_gateway")
        server = attach_gateway(run_dir, vllm, request.getfixturevalue("embedded_model_dir"))
    else:
        server = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    yield server
    server.stop()
