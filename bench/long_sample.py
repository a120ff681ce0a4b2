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
"""

from __future__ import annotations

import argparse
import json

from common import ROOT
from train_scale import eval_like, step_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--prompt", type=int, default=9800, help="the long sample's prompt tokens")
    parser.add_argument("--baseline-prompt", type=int, default=1000, help="the short sample's prompt tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each step")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
