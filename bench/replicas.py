"""Two real vLLM-CPU replicas behind one gateway (`engine.vllm.urls`, clawrl/engine/replicas).

One `clawrl serve` starts both (`--engine.vllm.start true --engine.vllm.urls` on two free ports of
127.0.0.1; the embedded model, LoRA versions), then:

1. sessions: `--sessions` conversations of `--turns` turns, `--streams` at a time; prints each
   replica's share of the turns and whether every session stayed on one replica (the recorded
   turns' `sampling["replicas"]`);
2. a version: a rank-8 LoRA version published as the trainer publishes one; prints the seconds
   until /healthz announces it, and the version each replica serves then (both: v1);
3. a death: while `--streams` answers stream, one replica's vLLM is killed (SIGKILL to its process
   group); prints the failed requests (0 expected), how many answers each replica's turn names
   (two: moved mid-answer), and the seconds until its supervisor has it back and in step.

Two vLLM-CPU servers take about 3 GB each (`--kv-gib` of KV cache each). The run folder is kept (its
path is printed): the gateway's and each vLLM's logs are in it. Not a timed test.

    nice -n 19 .venv/bin/python bench/replicas.py [--sessions 6] [--turns 3] [--streams 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import start_server  # noqa: E402
from clawrl.launcher import ServerProcess  # noqa: E402
from clawrl.net import free_port  # noqa: E402


def replicas(server: ServerProcess) -> list[dict]:
    return list(server.health()["engine"]["extra"]["replicas"])


def back_in_step(server: ServerProcess, url: str) -> bool:
    return any(r["url"] == url and r["status"] == "ok" and r["synced"] for r in replicas(server))


def turns(server: ServerProcess) -> list:
    from clawrl.store.db import Store

    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return list(store.turns())


async def conversation(client, i: int, turns: int) -> str:
    messages = [{"role": "user", "content": f"Conversation {i}: tell me about the number {i}."}]
    for t in range(turns):
        stream = await client.chat.completions.create(
            model="clawrl", messages=messages, max_tokens=24, stream=True, extra_body={"ignore_eos": True}
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"And {t}?"}]
    return "ok"


async def bounded(n: int, jobs) -> list[str]:
    gate = asyncio.Semaphore(n)

    async def one(job) -> str:
        async with gate:
            try:
                return await job
            except Exception as exc:  # noqa: BLE001 (counted: the figure is how many failed)
                return f"failed: {type(exc).__name__}: {exc}"

    return await asyncio.gather(*(one(j) for j in jobs))


def sessions(server: ServerProcess, args: argparse.Namespace) -> None:
    client = server.async_client()
    results = asyncio.run(
        bounded(args.streams, [conversation(client, i, args.turns) for i in range(args.sessions)])
    )
    recorded = turns(server)
    by_session: dict[str, set[str]] = {}
    for turn in recorded:
        by_session.setdefault(turn.session_id, set()).update((turn.sampling or {}).get("replicas", []))
    share = Counter(r for turn in recorded for r in (turn.sampling or {}).get("replicas", []))
    print(f"sessions: {len(by_session)} with {len(recorded)} turns; failed {sum(r != 'ok' for r in results)}")
    print(f"  turns per replica: {dict(share)}")
    print(f"  every session on one replica: {all(len(r) == 1 for r in by_session.values())}")


def version(server: ServerProcess) -> None:
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded
    from clawrl.testing import Publisher
    from clawrl.train.weights import LoraSettings

    publisher = Publisher(server.run_dir, ensure_embedded(Config().cache_dir()), LoraSettings(8, 16))
    path = publisher.save(1)
    start = time.perf_counter()
    publisher.announce(1, path)
    while server.health()["version"] != "v1":
        time.sleep(0.1)
    print(f"version: v1 announced {time.perf_counter() - start:.2f} s after it was published")
    print(f"  each replica serves: {[r['version'] for r in replicas(server)]}")


async def answer(client, i: int) -> str:
    r = await client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": f"Write a long story, number {i}."}],
        max_tokens=96,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Session-Id": f"death-{i}"},
    )
    return "ok" if r.choices[0].finish_reason == "length" else f"short: {r.choices[0].finish_reason}"


def death(server: ServerProcess, args: argparse.Namespace) -> None:
    victim = replicas(server)[0]
    before = len(turns(server))

    async def run() -> list[str]:
        client = server.async_client()
        jobs = asyncio.gather(*(answer(client, i) for i in range(args.streams)))
        await asyncio.sleep(args.kill_after_s)
        os.killpg(victim["pid"], signal.SIGKILL)
        killed_at = time.perf_counter()
        results = await jobs
        while not any(
            r["url"] == victim["url"] and r["status"] == "ok" and r["synced"] for r in replicas(server)
        ):
            await asyncio.sleep(0.5)
        print(
            f"  {victim['url']} back and in step {time.perf_counter() - killed_at:.1f} s after it was killed"
        )
        return results

    results = asyncio.run(run())
    moved = [t.sampling["replicas"] for t in turns(server)[before:]]
    print(f"death: {args.streams} answers streaming, {victim['url']} killed after {args.kill_after_s} s")
    print(f"  failed: {sum(r != 'ok' for r in results)} {[r for r in results if r != 'ok']}")
    print(f"  replicas per answer: {[len(m) for m in moved]} (2: moved mid-answer)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--kill-after-s", type=float, default=3.0)
    parser.add_argument("--kv-gib", type=int, default=1)  # vLLM-CPU 0.32 reads whole GiB only
    args = parser.parse_args()
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    run_dir = Path(tempfile.mkdtemp(prefix="clawrl-replicas-")) / "run"  # kept: vLLM's logs are in it
    print(f"run folder: {run_dir}", flush=True)
    run = ["--engine.kind", "vllm", "--engine.vllm.start", "true", "--engine.vllm.urls", json.dumps(urls)]
    run += ["--engine.vllm.kv-cache-gib", str(args.kv_gib), "--judge.enabled", "false"]
    start = time.perf_counter()
    with start_server(run_dir, run, timeout=900) as server:
        print(f"two vLLM replicas up in {time.perf_counter() - start:.0f} s: {urls}")
        sessions(server, args)
        version(server)
        death(server, args)


if __name__ == "__main__":
    main()
