"""Pieces the benchmarks share: the server launcher, load generators, percentiles, a tiny model,
process memory, and the streaming phases bench/serve.py and bench/serve_vllm.py both run."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawrl.launcher import ServerProcess  # noqa: E402
from clawrl.testing import make_tiny_model  # noqa: E402

if TYPE_CHECKING:
    import argparse

    from openai import AsyncOpenAI

__all__ = [
    "REQUEST_TIMEOUT_S",
    "ROOT",
    "SERVED_MODEL",
    "TEMPERATURE",
    "burst",
    "conversation",
    "conversations",
    "p95",
    "rss_mb",
    "run_server",
    "server_phase",
    "start_server",
    "stream_once",
    "tiny_model",
]

SERVED_MODEL = "clawrl"  # the server's default served_model_name
TEMPERATURE = 1.0
REQUEST_TIMEOUT_S = 300.0
QUESTIONS = [
    "What is a good way to start the morning?",
    "How do I keep basil alive on a windowsill?",
    "Why is the sky blue?",
    "What should I pack for a weekend hike?",
    "How long should I boil an egg?",
    "What is a simple dinner I can cook in twenty minutes?",
    "How can I fall asleep faster?",
    "What is the difference between weather and climate?",
]


def start_server(run_dir: Path, args: Sequence[str], timeout: float = 600.0, **kw: Any) -> ServerProcess:
    """`clawrl serve` (clawrl.launcher) as most benchmarks run it: the trainer and the guard off
    unless `args` turn them on, so a benchmark measures only what it names."""
    return ServerProcess(run_dir, args, off=("train", "guard"), start_timeout_s=timeout, **kw)


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


async def burst(server: ServerProcess, clients: int, turns: int, max_tokens: int) -> list[float]:
    client = server.async_client()
    results = await asyncio.gather(*[conversation(client, i, turns, max_tokens) for i in range(clients)])
    await client.close()
    return [x for r in results for x in r]


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def tiny_model(tmp: Path) -> Path:
    """The tests' tiny random model (real tokenizer), for measuring everything but the model."""
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    return make_tiny_model(tmp / "tiny", ensure_embedded(Config().cache_dir()))


# --- streaming phases (bench/serve.py, bench/serve_vllm.py) ----------------------------------


def conversations(n: int) -> list[list[dict]]:
    """One distinct single-turn chat per client (the questions repeat beyond eight clients)."""
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]


async def stream_once(
    client: AsyncOpenAI,
    chat: list[dict],
    max_tokens: int,
    model: str = SERVED_MODEL,
    temperature: float | None = TEMPERATURE,
) -> tuple[int, float]:
    """Stream one answer: (completion tokens from the usage chunk, seconds to the first content).
    `temperature` None: none sent, the model's own defaults sample (as every other parameter)."""
    start = time.perf_counter()
    ttft, tokens = None, None
    sampling = {} if temperature is None else {"temperature": temperature}
    stream = await client.chat.completions.create(
        model=model,
        messages=chat,
        max_tokens=max_tokens,
        **sampling,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if ttft is None or tokens is None:
        raise RuntimeError(f"stream ended without content or usage (ttft={ttft}, tokens={tokens})")
    return tokens, ttft


async def timed_request(
    client: AsyncOpenAI,
    chat: list[dict],
    max_tokens: int,
    model: str,
    temperature: float | None = TEMPERATURE,
) -> tuple[int, float]:
    """(completion tokens from the usage chunk, seconds to the first content chunk)."""
    answer = stream_once(client, chat, max_tokens, model, temperature)
    return await asyncio.wait_for(answer, REQUEST_TIMEOUT_S)


async def server_phase(base_url: str, n: int, args: argparse.Namespace, model: str = SERVED_MODEL) -> dict:
    """N concurrent streaming clients, `--requests` each, timed as one phase after one warm-up
    request. `base_url`: any OpenAI-compatible server (clawrl's /v1, or vLLM's own)."""
    from openai import AsyncOpenAI

    chats = conversations(n)
    t = getattr(args, "temperature", TEMPERATURE)  # None: the model's own (bench/serve.py --model-defaults)
    async with AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=REQUEST_TIMEOUT_S) as c:
        await timed_request(c, chats[0], args.max_tokens, model, t)  # warm-up

        async def client_loop(chat: list[dict]) -> list[tuple[int, float]]:
            return [await timed_request(c, chat, args.max_tokens, model, t) for _ in range(args.requests)]

        start = time.perf_counter()
        per_client = await asyncio.gather(*(client_loop(chat) for chat in chats))
        wall = time.perf_counter() - start
    results = [r for rs in per_client for r in rs]
    tokens, ttfts = sum(t for t, _ in results), [s for _, s in results]
    short = sum(t != args.max_tokens for t, _ in results)
    return {
        "clients": n, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
        "ttft_median_s": statistics.median(ttfts), "ttft_max_s": max(ttfts),
        "ttft_s": ttfts, "short_completions": short,
    }  # fmt: skip


def run_server(folder: Path, args: argparse.Namespace) -> list[dict]:
    """`clawrl serve` on the local engine with its default settings, every `--clients` phase
    against it, then stop it."""
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as tmp:
        run = ["--model", str(folder), "--server.log-level", "warning"]
        with ServerProcess(Path(tmp) / "run", run) as server:
            results = []
            for n in args.clients:
                results.append(asyncio.run(server_phase(server.url + "/v1", n, args)))
                print(f"  server {n:>2} x {args.requests}: {results[-1]['tok_s']:7.1f} tok/s", flush=True)
            return results
