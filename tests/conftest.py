"""Shared fixtures: a tiny random model with the real tokenizer, and live servers.

`RemoteServer` starts `python -m clawrl serve` as a real subprocess on a free
127.0.0.1 port and waits for /healthz, as a user would run it.
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


class RemoteServer:
    """`clawrl serve` in a subprocess, bound to 127.0.0.1 on a free port."""

    def __init__(
        self, run_dir: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 120.0
    ) -> None:
        self.port = free_port()
        self.run_dir = run_dir
        self.url = f"http://127.0.0.1:{self.port}"
        if "--train.enabled" not in args:  # the trainer process is tested where it matters; elsewhere it
            args = [*args, "--train.enabled", "false"]  # would only add a torch import per server
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
def tiny_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):
    server = RemoteServer(tmp_path_factory.mktemp("srv") / "run", ["--model", str(tiny_model_dir)])
    yield server
    server.stop()
