"""bench/adapters.py on vLLM-CPU: 1, 4 and 8 users' adapters in one batch against one adapter.

With users on and `engine.kind = "vllm"`, each user's version is a LoRA adapter loaded into the
vLLM server at run time, and a request names its user's (docs/users.md), so vLLM's multi-LoRA
batching decodes several users together. This bench starts vLLM as clawrl starts it
(`clawrl.engine.vllm.server.vllm_command`: `--enable-lora`, `--max-loras` 8 here), loads 8 adapters
(random B, `--rank`, every projection: the trainer's shape) through `/v1/load_lora_adapter` as
clawrl does, and times `--rows` greedy streams (`ignore_eos`, each `--tokens` long) decoding
together through vLLM's completions API: every row on the base, every row on one adapter, and the
rows spread over 4 and over 8 users' adapters. It prints tokens/s and the ratio to one adapter.

    .venv/bin/python bench/adapters_vllm.py            # the embedded model (vLLM from scripts/setup-vllm)
    .venv/bin/python bench/adapters_vllm.py --tiny     # the tests' tiny random model: the code path only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from adapters import PROMPT, adapters, options
from common import ROOT, tiny_model

from clawrl.config import Config, VLLMConfig
from clawrl.engine.vllm.server import BASE_NAME, vllm_command, vllm_env
from clawrl.model.load import ensure_embedded
from clawrl.net import free_port

START_TIMEOUT_S = 900.0


def vllm_python() -> str:
    """vLLM's python, installed once into the cache folder by scripts/setup-vllm."""
    done = subprocess.run([str(ROOT / "scripts" / "setup-vllm")], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM did not answer within {START_TIMEOUT_S:.0f} s")


async def decode(url: str, rows: int, tokens: int, models: list[str]) -> float:
    """Tokens/s of `rows` greedy streams decoding together, row i on `models[i % len(models)]`."""

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {"model": models[i % len(models)], "prompt": PROMPT, "max_tokens": tokens}
        body |= {"temperature": 0, "ignore_eos": True}
        r = await client.post(url + "/v1/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        made = await asyncio.gather(*[one(client, i) for i in range(rows)])
        return sum(made) / (time.perf_counter() - start)


def measure(model_dir: Path, folders: list[Path], args: argparse.Namespace, log: Path) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    v = VLLMConfig(max_loras=len(folders), max_lora_rank=args.rank)
    cmd = vllm_command(vllm_python(), model_dir, port, v, 2048, lora=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=vllm_env(v), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc, log)
        names = [f"u{k}" for k in range(len(folders))]
        for name, folder in zip(names, folders, strict=True):
            body = {"lora_name": name, "lora_path": str(folder)}
            httpx.post(url + "/v1/load_lora_adapter", json=body, timeout=300).raise_for_status()
        asyncio.run(decode(url, args.rows, 4, names))  # warm-up: every adapter in the batch once
        figures = {"base": asyncio.run(decode(url, args.rows, args.tokens, [BASE_NAME]))}
        figures["one adapter"] = asyncio.run(decode(url, args.rows, args.tokens, names[:1]))
        for users in (4, 8):
            figures[f"{users} users"] = asyncio.run(decode(url, args.rows, args.tokens, names[:users]))
        return figures
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    args = options(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(Path(tmp)) if args.tiny else ensure_embedded(Config().cache_dir())
        folders = adapters(model_dir, Path(tmp), 8, args.rank)
        figures = measure(model_dir, folders, args, Path(tmp) / "vllm.log")
    one = figures["one adapter"]
    for name, value in figures.items():
        print(f"{name:>12}: {value:9.1f} tokens/s  ({value / one:.2f}x one adapter)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
