"""What the canary gate adds to each version: its wall time against the training step it follows.

Run: .venv/bin/python bench/guard.py [--model DIR] [--rounds 3] [--json PATH]

In one process, with the trainer's defaults (LoRA, `train.batch_size` samples,
the trainer's thread count): a training step on eval-like samples (200-token
prompts, 128-token answers, as `clawrl eval` makes), then the gate's check
(`Canary.check`) on the weights it produced, `--rounds` times, alternating so
machine noise hits both alike. The first check also measures the base model
(once per trainer process); the rest are what every later version pays. The
check is split into its parts: the likelihood of the 32 reference answers, 32
greedy answers (24 tokens at most, their entropy read as they are decoded)
with the base's answers scored in the references' pass (the collapse
figures), and the KL on the store's 8 newest turns.

Printed: median step and check seconds, their ratio (the share of a version's
time the gate adds), the first check, and the parts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawrl.config import Config  # noqa: E402
from clawrl.guard.gate import Canary  # noqa: E402
from clawrl.guard.measure import forward_kl  # noqa: E402
from clawrl.model.load import model_folder, served_context  # noqa: E402
from clawrl.store.db import Store  # noqa: E402
from clawrl.train.policy import build_policy  # noqa: E402
from clawrl.types import Sample, Turn  # noqa: E402


def eval_like(n: int, prompt: int = 200, response: int = 128) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(100, 40000, (prompt + response,), generator=gen).tolist()
        kind = "rl" if i % 2 else "opd"
        extra = {"teacher_prompt_ids": ids[: prompt + 12]} if kind == "opd" else {}
        out.append(
            Sample(f"t{i}", kind, ids[:prompt], ids[prompt:], [-2.0] * response, "v0", 1.0, 1.0, **extra)
        )
    return out


def store_with_turns(folder: Path, samples: list[Sample]) -> Store:
    store = Store.open(folder / "clawrl.db")
    store.upsert_session("s", "bench", 1.0)
    for i, s in enumerate(samples):
        ids = (s.prompt_ids, s.response_ids, s.logprobs)
        store.insert_turn(
            Turn(f"t{i}", "s", i, "main", [], None, *ids, "x", [], "stop", ["v0"], 1.0, i, i + 1)
        )
    return store


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = Config(model={"path": args.model} if args.model else {})
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the trainer's default
    base = model_folder(config.model.path, config.cache_dir())
    cfg = config.train
    policy = build_policy(
        base, cfg, "cpu", served_context(config.model.path, config.model.max_context), keep_base=True
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    batch = eval_like(cfg.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        store = store_with_turns(Path(tmp), batch)
        canary = Canary.build(store, tokenizer, config.guard, policy.cfg.micro_batch_tokens)
        steps, checks, first = [], [], None
        for r in range(args.rounds + 1):
            step_s, _ = timed(lambda: policy.trainer.step(batch))
            check_s, (_, figures) = timed(lambda: canary.check(policy))
            if r == 0:  # warm-up step; its check measures the base too
                first = check_s
                continue
            steps.append(step_s)
            checks.append(check_s)
        parts = {
            "likelihood + greedy + collapse": timed(
                lambda: canary.measure(policy.model, canary.base(policy).answers)
            )[0],
            "kl": timed(
                lambda: forward_kl(
                    lambda: nullcontext(policy.model),
                    policy.trainer.reference,
                    [(p[-128:], r[:32]) for p, r in store.recent_token_ids(8)],
                )
            )[0],
        }
        store.close()
    step, check = statistics.median(steps), statistics.median(checks)
    result = {
        "step_s": step,
        "check_s": check,
        "ratio": check / step,
        "first_check_s": first,
        "parts_s": parts,
        "figures": figures,
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
    }
    print(f"training step ({cfg.batch_size} samples, 200+128 tokens): {step:.2f} s (median of {len(steps)})")
    print(f"canary check: {check:.2f} s = {check / step:.2f}x the step it follows")
    print(f"first check of a trainer process (measures the base too): {first:.2f} s")
    print("parts: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
