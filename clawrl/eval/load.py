"""A load generator for a running server: many streaming clients, some of which hang up mid-stream.

Used by the load test (tests/slow/test_load.py) and bench/load.py. Each staying client streams
one answer of `max_tokens` tokens to the end; each leaving client reads `leave_after` chunks and
closes its connection. What a user would see is collected: time to first token per staying
client (to the first chunk with answer text), and every failure with its error.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import httpx

from clawrl.net import pool_limits


@dataclass
class LoadResult:
    ttft_s: list[float] = field(default_factory=list)  # staying clients that got a first token
    completed: int = 0  # staying clients that read their answer to the end
    left: int = 0  # leaving clients that hung up as planned
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def percentile(self, q: float) -> float:
        if not self.ttft_s:
            return float("nan")
        if len(self.ttft_s) == 1:
            return self.ttft_s[0]
        return statistics.quantiles(self.ttft_s, n=100, method="inclusive")[int(q) - 1]


async def run_load(
    base_url: str,
    staying: int,
    leaving: int,
    max_tokens: int = 16,
    leave_after: int = 2,
    timeout: float = 600.0,
    api_key: str = "unused",
) -> LoadResult:
    """Start `staying` + `leaving` streaming requests at once against `base_url` (…/v1); wait for all."""
    result = LoadResult()
    limits = pool_limits(staying + leaving + 4)
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, headers=headers) as http:
        start = time.perf_counter()
        jobs = [
            _stream(http=http, i=i, max_tokens=max_tokens, leave_after=None, result=result)
            for i in range(staying)
        ]
        jobs += [
            _stream(http=http, i=staying + i, max_tokens=max_tokens, leave_after=leave_after, result=result)
            for i in range(leaving)
        ]
        await asyncio.gather(*jobs)
        result.wall_s = time.perf_counter() - start
    return result


async def _stream(
    http: httpx.AsyncClient, i: int, max_tokens: int, leave_after: int | None, result: LoadResult
):
    body = {
        "model": "clawrl",
        "messages": [{"role": "user", "content": f"Client {i}: tell me about the number {i}."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,  # every staying answer is exactly max_tokens long
    }
    sent = time.perf_counter()
    chunks = 0
    try:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                result.failures.append(f"client {i}: HTTP {response.status_code} {await response.aread()!r}")
                return
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    result.completed += leave_after is None
                    return
                if not _has_text(line):
                    continue  # the opening role chunk, the usage chunk, keep-alives
                chunks += 1
                if chunks == 1 and leave_after is None:
                    result.ttft_s.append(time.perf_counter() - sent)
                if leave_after is not None and chunks >= leave_after:
                    result.left += 1
                    return  # leaving the `async with` closes the connection mid-stream
        result.failures.append(f"client {i}: the stream ended without [DONE] after {chunks} chunks")
    except (httpx.HTTPError, OSError) as error:
        result.failures.append(f"client {i}: {type(error).__name__}: {error}")


def _has_text(line: str) -> bool:
    """Whether an SSE line is a chunk carrying answer text (a token), not the role or usage chunk."""
    if not line.startswith("data: "):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))
