"""One training step on a sample as long as an agent's turn, against a short one, in the same run.

Run: .venv/bin/python bench/long_sample.py [--prompt 9800] [--baseline-prompt 1000] [--threads 1]

Behind OpenClaw's default profile every main turn's prompt is ~10-13k tokens, past the old
`train.max_seq_len` of 4096: the trainer skipped every one. Now the window is the served one
and a long sample is trained alone in its micro-batch. This measures what that costs: one
`Trainer.step` (LoRA, the default config: activation checkpointing, response-only logits,
chunked log-probs, KL on) of one sample with a `--prompt`-token prompt and a 128-token answer,
and the same with a `--baseline-prompt`-token prompt, each in a fresh process (peak RSS is the
step's alone). Printed: peak RSS and step time of each, and their ratios against the prompt
ratio (memory that grew like the sequence, not its square, has a ratio near the length's or
below it). Default model: the embedded SmolLM2-135M.

`--session TOKENS`: instead, one packed session at a 151,936-row vocabulary (a tiny-width
Qwen3, clawrl/model/tiny.py, its window widened to fit): `--turns` turns, each a user message
and a `--answer`-token answer, whose last sequence is TOKENS long; the trainer scores it as one
row (train/packing.py) and runs the LM head at the answers only (train/batch.py). Printed: the
step's peak RSS above the loaded model against the arithmetic of its logits (float32 on a CPU,
with their gradient: 2 x answers x vocabulary x 4 bytes) and of logits at every position from the
first answer on (what the trainer kept until 2026-11-27);
with `--ref REV`, the same step at git revision REV of this repository too (a checkout of it).
"""

from __future__ import annotations

import argparse
import json

from common import ROOT
from train_scale import checkout, eval_like, step_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--prompt", type=int, default=9800, help="the long sample's prompt tokens")
    parser.add_argument("--baseline-prompt", type=int, default=1000, help="the short sample's prompt tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each step")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--session", type=int, help="a packed session of this many tokens")
    parser.add_argument("--turns", type=int, default=10, help="--session: its turns")
    parser.add_argument("--answer", type=int, default=64, help="--session: each answer's tokens")
    parser.add_argument("--ref", help="--session: also step at this git revision (e.g. f519c3b~1)")
    args = parser.parse_args()
    if args.session:
        session(args)
        return
    from pathlib import Path

    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    model = Path(args.model) if args.model else ensure_embedded(Config().cache_dir())
    runs = {}
    for name, prompt in (("short", args.baseline_prompt), ("long", args.prompt)):
        runs[name] = step_memory(ROOT, model, eval_like(1, prompt=prompt), args.threads) | {"prompt": prompt}
        r = runs[name]
        print(f"{name:5} {prompt + 128:6d} tokens: peak {r['peak_mb']:7.0f} MB "
              f"(model loaded {r['loaded_mb']:.0f} MB), step {r['step_s']:6.1f} s", flush=True)  # fmt: skip
    short, long = runs["short"], runs["long"]
    length = (long["prompt"] + 128) / (short["prompt"] + 128)
    grown = (long["peak_mb"] - long["loaded_mb"]) / max(1.0, short["peak_mb"] - short["loaded_mb"])
    print(f"long / short: length {length:.1f}x, step memory above the loaded model {grown:.1f}x, "
          f"time {long['step_s'] / short['step_s']:.1f}x")  # fmt: skip
    if args.json:
        figures = runs | {"length_ratio": length, "memory_ratio": grown}
        Path(args.json).write_text(json.dumps(figures, indent=1))


def session(args: argparse.Namespace) -> None:
    import tempfile
    from pathlib import Path

    import torch

    from clawrl.config import Config
    from clawrl.model.qwen3_tokenizer import VOCAB_SIZE
    from clawrl.model.tiny import tiny_qwen3
    from clawrl.types import Sample

    gen = torch.Generator().manual_seed(0)
    message = args.session // args.turns - args.answer
    seq: list[int] = []
    samples = []
    for k in range(args.turns):
        seq += torch.randint(100, 150000, (message,), generator=gen).tolist()
        answer = torch.randint(100, 150000, (args.answer,), generator=gen).tolist()
        logprobs = [-11.9] * args.answer  # near a random model's at this vocabulary
        samples.append(Sample(f"t{k}", "rl", list(seq), answer, logprobs, "v0", 1.0, reward=(-1.0) ** k))
        seq += answer
    answers = args.turns * args.answer
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_qwen3(Path(tmp) / "qwen3", Config().cache_dir())
        config = json.loads((model / "config.json").read_text())
        config["max_position_embeddings"] = len(seq) + 1  # the session fits the trained window
        (model / "config.json").write_text(json.dumps(config))
        r = step_memory(ROOT, model, samples, args.threads)
        if args.ref:
            old = step_memory(checkout(args.ref, Path(tmp) / "ref"), model, samples, args.threads)
            above = old["peak_mb"] - old["loaded_mb"]
            print(
                f"at {args.ref}: step peak above the loaded model {above:.0f} MB (peak "
                f"{old['peak_mb']:.0f}, loaded {old['loaded_mb']:.0f}), step {old['step_s']:.1f} s"
            )
    step_mb = r["peak_mb"] - r["loaded_mb"]
    mib = 1 << 20
    answer_logits = 2 * answers * VOCAB_SIZE * 4 / mib
    span = len(seq) - len(samples[0].prompt_ids) + 1  # the positions kept from the first answer on
    whole_logits = 2 * span * VOCAB_SIZE * 4 / mib
    print(f"session {len(seq)} tokens, {args.turns} answers of {args.answer} tokens ({answers} positions)")
    print(f"step peak above the loaded model: {step_mb:.0f} MB (peak {r['peak_mb']:.0f}, loaded "
          f"{r['loaded_mb']:.0f}), step {r['step_s']:.1f} s")  # fmt: skip
    ratio = step_mb / answer_logits
    print(
        f"arithmetic, float32 logits and their gradient: at the answers {answer_logits:.0f} MiB, "
        f"from the first answer on ({span}) {whole_logits:.0f} MiB; peak / answers' {ratio:.2f}"
    )
    if args.json:
        figures = r | {"tokens": len(seq), "answers": answers, "answer_logits_mb": answer_logits}
        Path(args.json).write_text(json.dumps(figures | {"whole_logits_mb": whole_logits}, indent=1))


if __name__ == "__main__":
    main()
