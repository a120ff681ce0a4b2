"""What watching costs serving: p95 latency with the dashboard open and /metrics scraped, vs neither.

One server (default: the embedded SmolLM2-135M-Instruct), one run. Rounds alternate between
two phases, so drift on a shared machine hits both alike:

* quiet: `--clients` concurrent multi-turn conversations (the official `openai.AsyncOpenAI`,
  non-streaming, `ignore_eos`, `--max-tokens` each), nothing else;
* watched: the same load while a poller does what an open dashboard tab does (GET
  /dashboard/state.json every 2 s, the page's own period) and a Prometheus stand-in GETs
  /metrics every second. The browser itself is not run here: it renders on the user's machine.

Prints each phase's p95 request latency and the ratio watched/quiet (goal <= 1.02), and, as a
figure a busy shared machine disturbs less, the server's CPU time per request in each phase and
the CPU one /metrics scrape and one dashboard poll cost on the idle server (200 of each).

    .venv/bin/python bench/dashboard.py [--clients 4] [--turns 3] [--max-tokens 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import httpx
from common import burst, p95, start_server, tiny_model

from clawrl.launcher import ServerProcess

DASHBOARD_PERIOD_S = 2.0  # dashboard.js POLL_MS
SCRAPE_PERIOD_S = 1.0


async def watch(url: str, stop: asyncio.Event, seen: dict[str, int]) -> None:
    async def every(path: str, period: float) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while not stop.is_set():
                r = await http.get(path)
                r.raise_for_status()
                seen[path] = seen.get(path, 0) + 1
                with contextlib.suppress(TimeoutError):  # the period passed: poll again
                    await asyncio.wait_for(stop.wait(), period)

    await asyncio.gather(
        every("/dashboard/state.json", DASHBOARD_PERIOD_S), every("/metrics", SCRAPE_PERIOD_S)
    )


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cost(server: ServerProcess, path: str, n: int = 200) -> float:
    """Server CPU milliseconds per GET of `path` on an idle server."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        http.get(path).raise_for_status()
        before = cpu_s(server.proc.pid)
        for _ in range(n):
            http.get(path)
        return (cpu_s(server.proc.pid) - before) / n * 1000


async def phase(
    server: ServerProcess, args: argparse.Namespace, watched: bool, seen: dict[str, int]
) -> tuple[list[float], float]:
    """The latencies of one phase's requests, and the server CPU seconds it used."""
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(server.url, stop, seen)) if watched else None
    before = cpu_s(server.proc.pid)
    try:
        latencies = await burst(server, args.clients, args.turns, args.max_tokens)
    finally:
        stop.set()
        if watcher is not None:
            await watcher
    return latencies, cpu_s(server.proc.pid) - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4, help="quiet+watched pairs")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model instead of the embedded one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-dashboard-") as d:
        model = ["--model", str(tiny_model(Path(d)))] if args.tiny else []
        server = start_server(Path(d) / "run", [*model, "--judge.enabled", "false"], timeout=600)
        try:
            asyncio.run(burst(server, args.clients, 1, args.max_tokens))  # warm-up, not counted
            quiet: list[float] = []
            watched: list[float] = []
            cpu = {False: 0.0, True: 0.0}
            seen: dict[str, int] = {}
            start = time.monotonic()
            for i in range(args.rounds):
                order = (False, True) if i % 2 == 0 else (True, False)
                for w in order:
                    latencies, used = asyncio.run(phase(server, args, w, seen))
                    (watched if w else quiet).extend(latencies)
                    cpu[w] += used
            wall = time.monotonic() - start
            scrape_ms, poll_ms = idle_cost(server, "/metrics"), idle_cost(server, "/dashboard/state.json")
        finally:
            server.stop()
    q, w = p95(quiet), p95(watched)
    print(f"{len(quiet)} requests per phase, {args.clients} clients, {args.rounds} rounds, {wall:.0f} s")
    print(
        f"server CPU per request: quiet {cpu[False] / len(quiet) * 1000:.1f} ms, watched "
        f"{cpu[True] / len(watched) * 1000:.1f} ms (ratio {cpu[True] / cpu[False]:.3f})"
    )
    share = (scrape_ms / SCRAPE_PERIOD_S + poll_ms / DASHBOARD_PERIOD_S) / 1000
    print(
        f"idle server CPU: {scrape_ms:.2f} ms per /metrics scrape, {poll_ms:.2f} ms per dashboard poll "
        f"= {share * 100:.2f}% of one core at 1 scrape/s + 1 poll/2 s"
    )
    scrapes, polls = seen.get("/metrics", 0), seen.get("/dashboard/state.json", 0)
    print(f"while watched: {scrapes} /metrics scrapes, {polls} dashboard polls")
    print(f"p95 latency quiet:   {q * 1000:.1f} ms")
    print(f"p95 latency watched: {w * 1000:.1f} ms")
    ratio = w / q
    print(f"ratio watched/quiet: {ratio:.3f} ({'PASS' if ratio <= 1.02 else 'MISS'} against <= 1.02)")


if __name__ == "__main__":
    main()
