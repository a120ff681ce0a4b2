"""The workload figures of bench/gpu.py: what an agent's server meets, beyond equal short prompts.

- long prompts: `Scale.long_streams` concurrent streams whose prompts are of unequal lengths up
  to `Scale.long_prompt` tokens (13k on a GPU: an agent's system prompt, tools and history),
  decoded with Qwen3's sampling defaults (T 0.6, top_p 0.95, top_k 20). Baseline: the same
  number of streams on equal short prompts (bench/gpu.py's decode).
- decode after publish: one stream once v1 is served (the LoRA adapter the swap installed).
  Baseline: one stream at v0.
- serve while training: a trainer step in a process of its own (as `clawrl serve` runs its
  trainer), while the engine decodes `Scale.streams[1]` streams; the 99th percentile of the
  time between two tokens of a stream during the step. Baseline: the same streams with no
  step. Each process's peak memory (GPU allocated on CUDA, peak RSS on a CPU).
- train-vs-serve mismatch at v0: turns the engine decoded at T 0.6, scored by the trainer's
  policy (`clawrl.train.batch.score`) before any step: the mean and largest |trainer - served|
  logprob (numerics only: the same weights), and, for turns decoded at Qwen3's defaults, the
  importance weights the trainer would give them (`clawrl.train.importance`): their mean is
  the probability mass the top-k and nucleus cuts kept.

The trainer's process is this file run as `python bench/gpu_workload.py train-child ...`.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as the trainer's process: `python bench/gpu_workload.py train-child`
from bench.gpu_common import memory_mb  # noqa: E402

QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # Qwen3's generation_config.json


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


async def timed_stream(engine: Any, prompt: list[int], max_tokens: int, **sampling: Any) -> list[Any]:
    """(time, event) of each token of one completion."""
    from clawrl.engine.base import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return [(time.perf_counter(), event) async for event in engine.generate(prompt, params)]


def gaps(streams: list[list[Any]]) -> list[float]:
    """The times between consecutive tokens of each stream."""
    return [b[0] - a[0] for s in streams for a, b in zip(s, s[1:], strict=False)]


async def long_prompt_decode(engine: Any, scale: Any, ids: Any, figures: dict) -> dict[str, float]:
    n, longest = scale.long_streams, scale.long_prompt
    lengths = [longest * (n + i) // (2 * n) for i in range(1, n + 1)]  # unequal, up to `longest`
    start = time.perf_counter()
    done = await asyncio.gather(
        *(timed_stream(engine, ids(k), scale.decode_tokens, **QWEN3) for k in lengths)
    )
    tok_s = sum(len(d) for d in done) / (time.perf_counter() - start)
    return {
        "long_prompt_decode_tok_s": tok_s,
        "long_prompt_decode_ratio": tok_s / figures[f"decode_{n}_tok_s"],
    }


async def decode_after_publish(engine: Any, scale: Any, ids: Any, figures: dict) -> dict[str, float]:
    first = scale.streams[0]
    prompts = [ids(scale.decode_prompt) for _ in range(first)]
    start = time.perf_counter()
    done = await asyncio.gather(*(timed_stream(engine, p, scale.decode_tokens) for p in prompts))
    tok_s = sum(len(d) for d in done) / (time.perf_counter() - start)
    return {
        "decode_after_publish_tok_s": tok_s,
        "decode_after_publish_ratio": tok_s / figures[f"decode_{first}_tok_s"],
    }


async def mismatch_at_v0(engine: Any, policy: Any, scale: Any, ids: Any) -> dict[str, float]:
    """The trainer's logprobs of turns the engine decoded, before any step (see the module's doc)."""
    import torch

    from clawrl.train.batch import left_pad, score
    from clawrl.train.importance import truncated_weights

    def trainer(turns: list[tuple[list[int], list[Any]]], temperature: float) -> tuple[Any, Any, Any]:
        prompts, responses = [p for p, _ in turns], [[e.token_id for _, e in d] for _, d in turns]
        served = [[e.logprob for _, e in d] for _, d in turns]
        batch = left_pad(prompts, responses, next(policy.model.parameters()).device)
        with torch.no_grad():
            logp, _ = score(policy.model, batch, torch.full((len(turns),), temperature), with_entropy=False)
        mu = torch.tensor(served, device=logp.device)
        return logp.float(), mu, torch.ones_like(mu)

    async def turns(**sampling: Any) -> list[tuple[list[int], list[Any]]]:
        prompts = [ids(scale.decode_prompt) for _ in range(scale.streams[1])]
        done = await asyncio.gather(
            *(timed_stream(engine, p, scale.decode_tokens, **sampling) for p in prompts)
        )
        return list(zip(prompts, done, strict=True))

    prox, mu, _ = trainer(await turns(temperature=QWEN3["temperature"]), QWEN3["temperature"])
    gap = (prox - mu).abs()
    prox, mu, mask = trainer(await turns(**QWEN3), QWEN3["temperature"])
    recorded = torch.ones(mu.shape[0], dtype=torch.bool, device=mu.device)
    weights, _ = truncated_weights(prox, mu, mask, recorded, policy.cfg.is_cap)
    return {
        "mismatch_v0": gap.mean().item(),
        "mismatch_v0_max": gap.max().item(),
        "is_weight_v0_mean": weights.mean().item(),
    }


async def serve_while_training(
    engine: Any, config: Any, scale: Any, ids: Any, device: str, save_to: Path | None = None
) -> dict:
    """p99 inter-token time of `streams[1]` streams with no step, then during a step in a child.
    With `save_to` (a run folder) the child writes the trained model there as v1, as the trainer
    does, and the result's `version_path` names it (bench/gpu_check.py swaps it in)."""
    n = scale.streams[1]

    async def round_of_streams() -> list[list[Any]]:
        return await asyncio.gather(*(timed_stream(engine, ids(scale.decode_prompt), scale.decode_tokens)
                                      for _ in range(n)))  # fmt: skip

    quiet = gaps(await round_of_streams())
    spec = train_child_args(config, scale, device, save_to)
    child = subprocess.Popen(
        [sys.executable, __file__, "train-child", json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert child.stdin and child.stdout
    try:
        if (line := await asyncio.to_thread(child.stdout.readline)).strip() != "ready":
            raise RuntimeError(f"the training process did not start: {line!r}")
        child.stdin.write("go\n")
        child.stdin.flush()
        result = asyncio.ensure_future(asyncio.to_thread(child.stdout.readline))
        busy: list[float] = []
        while not result.done():
            busy += gaps(await round_of_streams())
        step = json.loads(await result)
    finally:
        child.kill() if child.poll() is None else None
        child.wait()
    p99_quiet, p99_busy = percentile(quiet, 99), percentile(busy, 99)
    return {
        "itl_p99_quiet_ms": 1000 * p99_quiet,
        "itl_p99_training_ms": 1000 * p99_busy,
        "itl_p99_ratio": p99_busy / p99_quiet,
        "serve_while_training_step_s": step["step_s"],
        "server_peak_mb": memory_mb(device, peak=True),
        "trainer_peak_mb": step["peak_mb"],
    } | ({"version_path": step["version_path"]} if "version_path" in step else {})


def train_child_args(config: Any, scale: Any, device: str, save_to: Path | None = None) -> dict[str, Any]:
    from dataclasses import asdict

    return {"folder": config.model.path, "train": config.train.model_dump(mode="json"), "device": device,
            "scale": asdict(scale), "save_to": None if save_to is None else str(save_to)}  # fmt: skip


def train_child(spec: dict[str, Any]) -> None:
    """The trainer's process: build the policy, warm up, say "ready", step on "go", write the
    version where `save_to` says (if it does), print figures."""
    import torch

    from bench.gpu_common import Scale, memory_mb, random_ids, train_samples
    from clawrl.config import TrainConfig
    from clawrl.model.gpu import cap_process
    from clawrl.train.policy import build_policy

    scale, device = (
        Scale(**{k: tuple(v) if k == "streams" else v for k, v in spec["scale"].items()}),
        spec["device"],
    )
    train = TrainConfig(**spec["train"])
    if train.gpu_share is not None:  # held to the plan's share, as the trainer's process is
        cap_process(train.device or device, train.gpu_share)
    policy = build_policy(Path(spec["folder"]), train, device)
    vocab = policy.model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    samples = train_samples(scale, vocab, lambda n: random_ids(n, vocab, gen))
    policy.trainer.step(samples[:1])
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    policy.trainer.step(samples)
    if device == "cuda":
        torch.cuda.synchronize()
    figures: dict[str, Any] = {"step_s": time.perf_counter() - start, "peak_mb": memory_mb(device, peak=True)}
    if spec.get("save_to"):
        from clawrl.train.checkpoints import save_version

        manifest = {"step": 1, "samples": [], "metrics": {}, "parent": "v0"}
        figures["version_path"] = str(
            save_version(Path(spec["save_to"]), "v1", policy.model, policy.optimizer, manifest)
        )
    print(json.dumps(figures), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["train-child"]:
    train_child(json.loads(sys.argv[2]))
