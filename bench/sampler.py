"""The local engine's sampler against a decode step, in CPU time (robust to a shared machine).

A batch of N chat prompts is prefilled once on the model (default: the embedded SmolLM2-135M);
then, `--steps` times, one decode forward of the N rows and one `sample_rows` over their logits
at the model's own sampling defaults (its generation config: the embedded model's T 0.2, top_p
0.9 and its presence and frequency penalties) are each timed with `time.process_time`, which
counts this process's CPU seconds only, so other work on the machine shows less than in wall
time. It prints the median of each and the sampler's share of a step:

    .venv/bin/python bench/sampler.py [--rows 1,8] [--steps 40]

Run it at two commits to compare samplers (PYTHONPATH=<a checkout> .venv/bin/python ...).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import conversations  # noqa: E402
from clawrl.config import Config  # noqa: E402
from clawrl.engine.local.penalties import Penalties  # noqa: E402
from clawrl.engine.local.sampling import RowSampler, sample_rows  # noqa: E402
from clawrl.model.load import ensure_embedded, generation_defaults, load_model  # noqa: E402


@torch.inference_mode()
def measure(loaded, folder: Path, rows: int, steps: int) -> dict:
    d = generation_defaults(folder, True)
    tok = loaded.tokenizer
    chats = conversations(rows)
    texts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = loaded.model(input_ids=ids, attention_mask=mask, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    penalties = Penalties(d.repetition_penalty, d.frequency_penalty, d.presence_penalty)
    samplers = [
        RowSampler.create(d.temperature, d.top_p, 0, None, top_k=d.top_k, penalties=penalties, prompt_ids=p)
        for p in prompts
    ]
    forward, sample = [], []
    for _ in range(steps):
        start = time.process_time()
        picked = sample_rows(logits, samplers)
        sample.append(time.process_time() - start)
        nxt = torch.tensor([[s.token_id] for s in picked])
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], dim=1)
        start = time.process_time()
        out = loaded.model(input_ids=nxt, attention_mask=mask, past_key_values=cache, use_cache=True)
        forward.append(time.process_time() - start)
        cache, logits = out.past_key_values, out.logits[:, -1]
    f, s = statistics.median(forward), statistics.median(sample)
    return {"rows": rows, "forward_ms": 1000 * f, "sample_ms": 1000 * s, "sampler_share": s / (f + s)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--steps", type=int, default=40, help="decode steps timed per batch size")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    args = p.parse_args(argv)
    folder = args.model or ensure_embedded(Config().cache_dir())
    loaded = load_model(folder)
    print(f"sampler vs decode step, CPU time, {folder.name}, torch threads {torch.get_num_threads()}")
    for n in (int(r) for r in args.rows.split(",")):
        r = measure(loaded, folder, n, args.steps)
        print(f"rows {n}: forward {r['forward_ms']:.2f} ms, sample_rows {r['sample_ms']:.2f} ms, "
              f"sampler {100 * r['sampler_share']:.1f}% of a step")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
