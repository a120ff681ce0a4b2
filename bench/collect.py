"""What collection costs serving: latency with collection on vs off, and memory of abandoned sessions.

Run: .venv/bin/python bench/collect.py [--model DIR] [--rounds 4] [--sessions 10000]

1. Latency. Two servers on the same model run side by side, one with
   `--collect.enabled false`. 8 concurrent clients each run a 3-turn
   conversation (full history resent each turn, as OpenAI clients do); the
   servers take turns, round after round, so machine noise hits both alike.
   Printed: mean and p95 request latency for each, and the ratio on/off
   (target <= 1.05).
2. Memory. Against the collecting server on a tiny 2-layer model (so that the
   model's cost does not hide anything), 10,000 one-turn conversations that
   never come back. Printed: the server's resident memory before and after,
   per session, the sessions still tracked in memory, and the database size.
   A second pass with `--collect.max-open-sessions 1000` shows the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from common import burst, p95, rss_mb, start_server, tiny_model

from clawrl.launcher import ServerProcess


def latency(model_args: list[str], rounds: int, max_tokens: int, tmp: Path) -> dict:
    on = start_server(tmp / "on", model_args)
    off = start_server(tmp / "off", model_args + ["--collect.enabled", "false"])
    try:
        asyncio.run(burst(on, 2, 1, 2))
        asyncio.run(burst(off, 2, 1, 2))
        lat: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
            for name, server in order:
                lat[name] += asyncio.run(burst(server, 8, 3, max_tokens))
    finally:
        on.stop()
        off.stop()
    return {k: {"mean_s": statistics.mean(v), "p95_s": p95(v), "n": len(v)} for k, v in lat.items()}


async def abandon(server: ServerProcess, n: int, concurrency: int = 16) -> None:
    client = server.async_client()
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await client.chat.completions.create(
                model="clawrl",
                max_tokens=1,
                messages=[{"role": "user", "content": f"abandoned conversation number {i}"}],
            )

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    await client.close()


def memory(tiny: Path, sessions: int, cap: int | None, tmp: Path) -> dict:
    args = ["--model", str(tiny)] + (["--collect.max-open-sessions", str(cap)] if cap else [])
    server = start_server(tmp / f"mem-{cap}", args)
    try:
        asyncio.run(abandon(server, 200))  # warm up allocators and caches
        before = rss_mb(server.proc.pid)
        start = time.perf_counter()
        asyncio.run(abandon(server, sessions))
        took = time.perf_counter() - start
        after = rss_mb(server.proc.pid)
        tracked = server.health()["open_sessions"]
    finally:
        server.stop()
    db = (tmp / f"mem-{cap}" / "clawrl.db").stat().st_size / 2**20
    return {
        "sessions": sessions,
        "cap": cap,
        "rss_before_mb": before,
        "rss_after_mb": after,
        "kb_per_session": (after - before) * 1024 / sessions,
        "tracked": tracked,
        "db_mb": db,
        "requests_per_s": sessions / took,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder for the latency part (default: the embedded model)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--sessions", type=int, default=10000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        lat = latency(["--model", args.model] if args.model else [], args.rounds, args.max_tokens, tmp)
        ratio_mean = lat["on"]["mean_s"] / lat["off"]["mean_s"]
        ratio_p95 = lat["on"]["p95_s"] / lat["off"]["p95_s"]
        print(f"latency, 8 clients x 3 turns x {args.rounds} rounds, {args.max_tokens} tokens per answer")
        for k in ("off", "on"):
            mean, high = lat[k]["mean_s"] * 1000, lat[k]["p95_s"] * 1000
            print(f"  collect {k:3}: mean {mean:7.1f} ms   p95 {high:7.1f} ms   ({lat[k]['n']} requests)")
        verdict = "PASS" if ratio_mean <= 1.05 else "MISS"
        print(f"  ratio on/off: mean {ratio_mean:.3f}  p95 {ratio_p95:.3f}   target mean <= 1.05: {verdict}")
        tiny = tiny_model(tmp)
        for cap in (None, 1000):
            m = memory(tiny, args.sessions, cap, tmp)
            print(
                f"memory, {m['sessions']} abandoned sessions (cap {cap or 'default 10000'}): "
                f"RSS {m['rss_before_mb']:.0f} -> {m['rss_after_mb']:.0f} MB "
                f"({m['kb_per_session']:.2f} KB/session), tracked in memory {m['tracked']}, "
                f"database {m['db_mb']:.1f} MB, {m['requests_per_s']:.0f} requests/s"
            )


if __name__ == "__main__":
    main()
