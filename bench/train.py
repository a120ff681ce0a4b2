"""What training costs serving, and how fast it trains.

Run: .venv/bin/python bench/train.py [--model DIR] [--rounds 2] [--processes 1,2] [--baseline-ref main]

Five measurements, each against a baseline taken in the same run (the last
two are in bench/train_scale.py, and run only when named in --parts):

1. Step throughput. `Trainer.step` (LoRA, micro-batches, PPO loss with KL)
   on 16 samples of 96 prompt + 64 response tokens, against a bare PEFT loop
   over the same sequences (forward, sum of response logprobs, backward, AdamW
   step; no reference pass, no loss bookkeeping). Printed: tokens/s of each
   and their ratio.
2. Swap pause. One client streams 160 tokens; in every other stream a new
   version is published mid-stream and swapped in. Printed: the longest gap
   between two streamed tokens in a stream with a swap (median over streams,
   and the worst), against the median longest gap of the streams without
   one. The versions are published from another process, as the trainer does.
3. Latency while training. A server with its trainer (default niceness and
   threads, rewards from explicit ratings) serves 4 clients. Idle phases: the
   answers are not rated yet, so the trainer waits. Training phases: the
   previous phase's answers are rated first, so the trainer trains on them
   while the clients go on. Phases alternate `--rounds` times. Printed: p50 /
   p95 / p99 request latency in each, the p99 ratio (target <= 1.5), versions
   published during the training phases, and failed requests (target 0).
4. Memory (`--parts memory`). Peak RSS of one trainer step on eval-like
   samples (8 samples, rl and opd, 200-token prompts, 128-token answers) with
   this code and with `--baseline-ref` (default main), each in a fresh process.
5. Processes (`--parts processes`). `clawrl train` with 1 and with N ranks
   (`--processes 1,2`) on the same samples: step time, training tokens/s and
   their ratio to 1 process, and the trainer's peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
import train_scale
from common import start_server

from clawrl.config import Config, TrainConfig
from clawrl.launcher import ServerProcess
from clawrl.model.load import ensure_embedded
from clawrl.testing import Publisher
from clawrl.train.policy import build_policy
from clawrl.train.weights import LoraSettings
from clawrl.types import Sample


def samples(n: int = 16, prompt: int = 96, response: int = 64) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(100, 40000, (prompt + response,), generator=gen).tolist()
        out.append(
            Sample(
                f"t{i}",
                "rl",
                ids[:prompt],
                ids[prompt:],
                [-2.0] * response,
                "v0",
                1.0,
                1.0 if i % 2 else -1.0,
            )
        )
    return out


def bare_step(model, optimizer, batch: list[Sample]) -> None:
    optimizer.zero_grad()
    for s in batch:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids, logits_to_keep=len(s.response_ids) + 1).logits[0, :-1]
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.response_ids)[:, None])
        (-s.reward * logp.mean()).backward()
    optimizer.step()


def step_throughput(model_dir: Path) -> dict:
    policy = build_policy(model_dir, TrainConfig(), "cpu")
    batch = samples()
    tokens = sum(len(s.response_ids) for s in batch)
    timings: dict[str, list[float]] = {"trainer": [], "bare": []}
    for _ in range(3):  # alternate, so machine noise hits both alike; the first round warms up
        start = time.perf_counter()
        policy.trainer.step(batch)
        timings["trainer"].append(time.perf_counter() - start)
        start = time.perf_counter()
        bare_step(policy.model, policy.optimizer, batch)
        timings["bare"].append(time.perf_counter() - start)
    rates = {k: tokens / statistics.median(v[1:]) for k, v in timings.items()}
    return rates | {"ratio": rates["trainer"] / rates["bare"]}


async def longest_gap(server: ServerProcess, publish=None) -> tuple[float, set]:
    client = server.async_client()
    stream = await client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=160,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    stamps, prints, count = [], set(), 0
    async for chunk in stream:
        stamps.append(time.perf_counter())
        prints.add(chunk.system_fingerprint)
        count += 1
        if publish is not None and count == 40:
            asyncio.get_running_loop().run_in_executor(None, publish)
    await client.close()
    return max(b - a for a, b in zip(stamps[5:], stamps[6:], strict=False)), prints


def _publisher(run_dir: Path, model: Path, inbox, outbox) -> None:
    """Publishes version k for each k received, in a process of its own: the stream reader in this
    process must not wait on the publisher's GIL, or its own pause would be measured as the server's."""
    publisher = Publisher(run_dir, model, LoraSettings())
    for k in iter(inbox.get, None):
        publisher.publish(k)
        outbox.put(k)


def swap_pause(model: Path, tmp: Path, rounds: int) -> dict:
    """Longest token gap per stream, with and without a swap mid-stream, after warming up."""
    run_dir = tmp / "swap"
    # The trainer is on (as by default), so the server copies the base weights at start-up; it
    # idles (no samples) and follows the versions published here, shaped as its own (LoRA r16).
    args = [
        "--model",
        str(model),
        "--judge.enabled",
        "false",
        "--train.swap-poll-s",
        "0.05",
        "--train.enabled",
        "true",
    ]
    server = start_server(run_dir, args)
    ctx = multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=_publisher, args=(run_dir, model, inbox, outbox))
    worker.start()
    try:
        inbox.put(1)  # v1 outside any stream: the publisher's and the server's one-off costs
        outbox.get(timeout=300)
        asyncio.run(longest_gap(server))
        gaps: dict[str, list[float]] = {"swap": [], "none": []}
        for k in range(2, rounds * 2 + 2):
            gaps["none"].append(asyncio.run(longest_gap(server))[0])
            gap, prints = asyncio.run(longest_gap(server, lambda k=k: inbox.put(k)))
            assert {f"clawrl-v{k - 1}", f"clawrl-v{k}"} <= prints, f"no swap mid-stream: {prints}"
            gaps["swap"].append(gap)
            outbox.get(timeout=60)
    finally:
        inbox.put(None)
        worker.join(60)
        server.stop()
    return {k: statistics.median(v) for k, v in gaps.items()} | {"worst": max(gaps["swap"])}  # seconds


async def client_load(server: ServerProcess, n: int, clients: int, ids: list, errors: list) -> list[float]:
    client = server.async_client()

    async def one(i: int) -> list[float]:
        out = []
        for k in range(n):
            start = time.perf_counter()
            try:
                r = await client.chat.completions.create(
                    model="clawrl",
                    messages=[{"role": "user", "content": f"Client {i}, question {k}: name a colour."}],
                    max_tokens=32,
                    extra_body={"ignore_eos": True},
                )
                ids.append(r.id)
                out.append(time.perf_counter() - start)
            except Exception as exc:  # counted: the target is zero
                errors.append(repr(exc))
        return out

    results = await asyncio.gather(*[one(i) for i in range(clients)])
    await client.close()
    return [x for r in results for x in r]


def latency_while_training(model: Path, tmp: Path, rounds: int, requests: int) -> dict:
    args = ["--model", str(model), "--train.enabled", "true", "--judge.backend", "feedback", "--method", "rl"]
    server = start_server(tmp / "train", args)
    lat: dict[str, list[float]] = {"idle": [], "training": []}
    errors: list[str] = []
    published = 0
    try:
        unrated: list[str] = []
        for _ in range(rounds):
            lat["idle"] += asyncio.run(client_load(server, requests, 4, unrated, errors))
            before = server.health()["version"]
            for rid in unrated:  # rate the idle phase's answers: the trainer gets work
                httpx.post(server.url + "/v1/feedback", json={"response_id": rid, "rating": 1}, timeout=30)
            unrated = []
            lat["training"] += asyncio.run(client_load(server, requests, 4, [], errors))
            published += int(server.health()["version"][1:]) - int(before[1:])
            wait_until_idle(server)
    finally:
        server.stop()
    p = {k: percentiles(v) for k, v in lat.items()}
    return {"p": p, "ratio": p["training"][2] / p["idle"][2], "published": published, "errors": errors}


def wait_until_idle(server: ServerProcess, limit: float = 600) -> None:
    """Until the trainer has no full batch left (its log says it waits)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        trainer = [line for line in server.output().splitlines() if "clawrl.trainer:" in line]
        if trainer and "waiting for samples" in trainer[-1]:
            return
        time.sleep(1)


def percentiles(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    return tuple(s[min(len(s) - 1, int(q * len(s)))] for q in (0.5, 0.95, 0.99))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="requests per client per phase")
    parser.add_argument(
        "--parts", default="step,swap,latency", help="which measurements (comma list; also memory, processes)"
    )
    parser.add_argument("--processes", default="1,2", help="trainer process counts for `processes`")
    parser.add_argument("--steps", type=int, default=3, help="steps per run of `processes` (first: warm-up)")
    parser.add_argument("--baseline-ref", default="main", help="git revision `memory` compares against")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads of the trainer (shared out among its ranks)"
    )
    args = parser.parse_args()
    model = args.model or ensure_embedded(Config().cache_dir())
    parts = args.parts.split(",")
    if "step" in parts:
        step = step_throughput(model)
        print(
            f"step: trainer {step['trainer']:.0f} tokens/s, bare loop {step['bare']:.0f}, "
            f"ratio {step['ratio']:.2f}"
        )
    if "memory" in parts:
        print_memory(train_scale.memory(model, args.baseline_ref, args.threads), args.baseline_ref)
    if "processes" in parts:
        counts = [int(n) for n in args.processes.split(",")]
        print_processes(train_scale.processes(model, counts, args.steps, args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        if "swap" in parts:
            swap = swap_pause(model, Path(tmp), args.rounds)
            ms = {k: round(v * 1000) for k, v in swap.items()}
            print(
                f"swap pause: longest token gap across a swap {ms['swap']} ms (median; worst {ms['worst']}), "
                f"without a swap {ms['none']} ms: "
                f"ratio {swap['swap'] / swap['none']:.2f}"
            )
        if "latency" in parts:
            print_latency(latency_while_training(model, Path(tmp), args.rounds, args.requests))


def print_memory(m: dict, ref: str) -> None:
    base, this = m["baseline"], m["this"]
    for name, r in ((ref, base), ("this", this)):
        print(
            f"memory {name:<8}: peak RSS {r['peak_mb']:.0f} MB in one step "
            f"({r['loaded_mb']:.0f} MB after loading), step {r['step_s']:.1f} s"
        )
    print(
        f"peak RSS this / {ref}: {this['peak_mb'] / base['peak_mb']:.2f}; "
        f"step time {this['step_s'] / base['step_s']:.2f}"
    )


def print_processes(runs: dict) -> None:
    one = runs[min(runs)]
    for n, r in runs.items():
        rss = f"{r['peak_mb']:.0f} MB"
        print(
            f"processes {n}: step {r['step_s']:.2f} s, {r['tokens_per_s']:.0f} tokens/s "
            f"({r['tokens_per_s'] / one['tokens_per_s']:.2f} x {min(runs)} process), peak trainer RSS {rss}"
        )


def print_latency(lat: dict) -> None:
    for phase, (p50, p95, p99) in lat["p"].items():
        print(f"latency {phase:<8}: p50 {p50:.2f} s, p95 {p95:.2f} s, p99 {p99:.2f} s")
    print(
        f"p99 training / idle: {lat['ratio']:.2f} (target <= 1.5); versions published while measured: "
        f"{lat['published']}; failed requests: {len(lat['errors'])} (target 0)"
    )
    for error in lat["errors"][:5]:
        print("  ", error)


if __name__ == "__main__":
    main()
