"""Pieces the benchmarks share: load generators, percentiles, a tiny model, process memory."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import RemoteServer, make_tiny_model  # noqa: E402  (the tests' own launcher)

__all__ = ["ROOT", "RemoteServer", "burst", "conversation", "p95", "rss_mb", "tiny_model"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def conversation(client, i: int, turns: int, max_tokens: int) -> list[float]:
    messages = [{"role": "user", "content": f"Client {i}: tell me something about the number {i}."}]
    latencies = []
    for t in range(turns):
        start = time.perf_counter()
        r = await client.chat.completions.create(
            model="clawrl",
            messages=messages,
            max_tokens=max_tokens,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        latencies.append(time.perf_counter() - start)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"Go on ({t})."},
        ]
    return latencies


async def burst(server: RemoteServer, clients: int, turns: int, max_tokens: int) -> list[float]:
    client = server.async_client()
    results = await asyncio.gather(*[conversation(client, i, turns, max_tokens) for i in range(clients)])
    await client.close()
    return [x for r in results for x in r]


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def tiny_model(tmp: Path) -> Path:
    """The tests' tiny random model (real tokenizer), for measuring everything but the model."""
    from clawrl.config import Config
    from clawrl.engine.models import ensure_embedded

    return make_tiny_model(tmp / "tiny", ensure_embedded(Config().cache_dir()))
