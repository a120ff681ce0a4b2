"""How RoPE scaling changes the embedded model: short-text quality and long-context perplexity.

SmolLM2-135M-Instruct was trained with an 8,192-token window (rope_theta 1e5). clawrl serves it with
a longer one by scaling RoPE; this bench compares the candidates on text the model has not been
tuned on (this repository's own source and docs, so the run is reproducible offline):

- short: mean next-token NLL over chunks of `--short-len` tokens (what a short chat sees);
- long: NLL by position bucket over one `--long-len`-token sequence (prefilled in chunks with a KV
  cache, as the engine does).

    .venv/bin/python bench/context.py --long-len 16384

Figures are NLL differences against the unscaled model measured in the same run (lower is better).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache

from clawrl.config import Config
from clawrl.model.load import ensure_embedded, scaled_config

ROOT = Path(__file__).resolve().parent.parent


def corpus(tokenizer) -> list[int]:
    files = sorted((ROOT / "clawrl").rglob("*.py")) + sorted(ROOT.glob("*.md"))
    text = "\n\n".join(f.read_text() for f in files)
    return tokenizer(text)["input_ids"]


@torch.inference_mode()
def nll(model, ids: list[int], chunk: int = 1024) -> torch.Tensor:
    """Per-position NLL of ids[1:] given the prefix, prefilled chunk by chunk into one cache."""
    cache = DynamicCache(config=model.config)
    out = []
    x = torch.tensor([ids])
    for start in range(0, len(ids) - 1, chunk):
        piece = x[:, start : start + chunk + 1]
        inputs = piece[:, :-1] if piece.shape[1] > 1 else piece
        pos = torch.arange(start, start + inputs.shape[1])[None]
        logits = model(input_ids=inputs, position_ids=pos, past_key_values=cache, use_cache=True).logits
        targets = piece[:, 1:]
        lp = torch.log_softmax(logits[:, : targets.shape[1]].float(), -1)
        out.append(-lp.gather(-1, targets[..., None])[0, :, 0])
    return torch.cat(out)


def load(folder: Path, kind: str | None, context: int):
    """The embedded model; kind "yarn-hf" is YaRN with transformers' own attention factor."""
    config = AutoConfig.from_pretrained(folder)
    if kind is not None:
        config = scaled_config(config, context, kind.removesuffix("-hf"))
    if kind == "yarn-hf":
        config.rope_parameters.pop("attention_factor")
    return AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long-len", type=int, default=16384)
    ap.add_argument("--short-len", type=int, default=512)
    ap.add_argument("--short-chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = ensure_embedded(Config().cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = corpus(tokenizer)
    long_ids = ids[: args.long_len + 1]
    short_src = ids[len(ids) // 2 :]  # a different part of the corpus than the long sequence starts with
    shorts = [short_src[i * args.short_len : (i + 1) * args.short_len + 1] for i in range(args.short_chunks)]
    variants = {
        "none (8k trained)": None,
        "yarn x4 (clawrl: attention 1.0)": "yarn",
        "yarn x4 (transformers attention 1.139)": "yarn-hf",
        "linear x4": "linear",
    }
    edges = [0, 2048, 8192, 12288, 16384, 24576, 32768]
    buckets = [(a, b) for a, b in zip(edges, edges[1:], strict=False) if a < args.long_len]
    rows = {}
    for name, scaling in variants.items():
        t0 = time.perf_counter()
        model = load(folder, scaling, 32768)
        short = torch.cat([nll(model, s) for s in shorts]).mean().item()
        per_pos = nll(model, long_ids)
        rows[name] = (short, [per_pos[a:b].mean().item() for a, b in buckets], time.perf_counter() - t0)
        longs = [round(v, 3) for v in rows[name][1]]
        print(f"{name}: short {short:.4f}  long {longs}  ({rows[name][2]:.0f} s)", flush=True)
    base_short = rows["none (8k trained)"][0]
    header = " | ".join(f"{a // 1024}k-{b // 1024}k" for a, b in buckets)
    print(f"\n| RoPE | short NLL (vs none) | long NLL by position: {header} |")
    print("| --- | --- | " + " | ".join("---" for _ in buckets) + " |")
    for name, (short, longs, _) in rows.items():
        cells = " | ".join(f"{v:.3f}" if math.isfinite(v) else "inf" for v in longs)
        print(f"| {name} | {short:.4f} ({short - base_short:+.4f}) | {cells} |")


if __name__ == "__main__":
    main()
