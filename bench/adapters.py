"""Decoding with an adapter per user: 1, 4 and 8 users' adapters in one batch against one adapter.

The local engine with an adapter per user (`train.adapters = "per_user"`, clawrl/engine/local/stack.py)
decodes every row with its own user's LoRA adapter: each adapted layer gathers the rows' A and B
and adds the side term with two batched matmuls. This bench times that against one adapter served
to every row, the way a server without users serves a version (`MergedLora` on a float32 model, side
paths on a bf16 one), on the same model in one process: `--rows` greedy streams (`ignore_eos`, every
one `--tokens` long) decoding together, their rows spread over 1, 4 and 8 users, each user with an
adapter of its own (random B, `--rank`, every projection). It prints decode tokens/s for each, the
ratio to one adapter, and the memory the stack holds per served adapter.

    .venv/bin/python bench/adapters.py                 # the embedded model
    .venv/bin/python bench/adapters.py --tiny          # the tests' tiny random model: the code path only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from common import tiny_model

from clawrl.config import Config
from clawrl.model.load import ensure_embedded

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]


def adapters(model_dir: Path, out: Path, users: int, rank: int) -> list[Path]:
    """`users` adapter folders on `model_dir`, each with its own random B (strong enough to matter)."""
    import torch
    from transformers import AutoModelForCausalLM

    from clawrl.train.weights import LoraSettings, attach_lora

    model = attach_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraSettings(rank, 2 * rank))
    folders = []
    for k in range(users):
        torch.manual_seed(k)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
        model.save_pretrained(out / f"u{k}")
        folders.append(out / f"u{k}")
    return folders


async def decode(engine, rows: int, tokens: int, users: list[str]) -> float:
    """Tokens/s of `rows` greedy streams decoding together, row i as `users[i % len(users)]`."""
    from clawrl.engine.base import SamplingParams

    async def one(i: int) -> int:
        params = SamplingParams(
            max_tokens=tokens, temperature=0, ignore_eos=True, adapter=users[i % len(users)]
        )
        return sum([1 async for _ in engine.generate(PROMPT, params)])

    start = time.perf_counter()
    made = await asyncio.gather(*[one(i) for i in range(rows)])
    return sum(made) / (time.perf_counter() - start)


async def measure(model_dir: Path, folders: list[Path], rows: int, tokens: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from clawrl.engine.local.engine import LocalEngine
    from clawrl.types import Version

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, float] = {}
    for per_user in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        engine = LocalEngine(
            model, model_name="b", max_context=2048, stop_token_ids=frozenset(), per_user=per_user
        )
        await engine.start()
        try:
            if not per_user:  # one adapter for every row: a server without users
                await engine.serve_version(Version("v1", 1, str(folders[0])))
                await decode(engine, rows, 4, ["default"])  # warm-up
                out["one adapter"] = await decode(engine, rows, tokens, ["default"])
                continue
            names = [f"u{k}" for k in range(len(folders))]
            for name, folder in zip(names, folders, strict=True):
                await engine.serve_version(Version(f"{name}/v1", 1, str(folder)))
            await decode(engine, rows, 4, names)  # warm-up
            for users in (1, 4, 8):
                if users <= len(names):
                    out[f"{users} users"] = await decode(engine, rows, tokens, names[:users])
            stack = engine.stats().extra["adapters"]
            out["MB per adapter"] = stack["bytes"] / (len(names) + 1) / 1e6  # slot 0 (the base) included
        finally:
            await engine.stop()
        del model, engine
    return out


def options(doc: str | None) -> argparse.Namespace:
    """The command line of this bench and of bench/adapters_vllm.py."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tests' tiny random model")
    p.add_argument("--rows", type=int, default=8, help="streams decoding together")
    p.add_argument("--tokens", type=int, default=64, help="tokens each stream decodes")
    p.add_argument("--rank", type=int, default=16, help="each adapter's LoRA rank")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args()


def main() -> None:
    args = options(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(Path(tmp)) if args.tiny else ensure_embedded(Config().cache_dir())
        folders = adapters(model_dir, Path(tmp), 8, args.rank)
        figures = asyncio.run(measure(model_dir, folders, args.rows, args.tokens))
    one = figures["one adapter"]
    for name, value in figures.items():
        speed = not name.startswith("MB")
        ratio = f"  ({value / one:.2f}x one adapter)" if speed else ""
        unit = " tokens/s" if speed else ""
        print(f"{name:>14}: {value:9.1f}{unit}{ratio}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
