"""Full-weight versions reloaded into a running vLLM in place (clawrl/engine/vllm/reload.py).

One vLLM start (as clawrl starts it for `train.weights = "full"`: no LoRA, VLLM_SERVER_DEV_MODE=1,
the key guard) on a copy of the model with every weight moved (`--noise` x its mean magnitude), its
greedy answers to a few prompts recorded fresh; then `--swaps` swaps through `VLLMEngine
.serve_version`, alternating the base folder and that copy, each with `--streams` sampled answers
in flight. Prints each swap's seconds (vLLM paused) and the failed requests, and whether the copy
reloaded answers exactly as it did fresh (texts and logprobs) while the base answers otherwise.

    nice -n 15 .venv/bin/python bench/vllm_reload.py [--swaps 4] [--streams 4]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path


def moved_copy(base: Path, out: Path, noise: float) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.abs().mean())
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    return out


async def answers(engine, prompts: list[list[int]]) -> list[tuple[str, list[float]]]:
    body = {"model": engine._base, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    out = []
    for prompt in prompts:
        choice = (await engine._call("POST", "/v1/completions", {**body, "prompt": prompt}))["choices"][0]
        out.append((choice["text"], choice["logprobs"]["token_logprobs"]))
    return out


async def in_flight(engine, i: int) -> str:
    body = {"model": engine._base, "prompt": list(range(300 + i, 340 + i)), "max_tokens": 160}
    body |= {"temperature": 0.8, "ignore_eos": True}
    try:
        await engine._call("POST", "/v1/completions", body)
        return "ok"
    except Exception as exc:  # noqa: BLE001 (counted: the figure is how many failed)
        return f"failed: {exc}"


async def run(args: argparse.Namespace, base: Path, moved: Path) -> None:
    from clawrl.config import VLLMConfig
    from clawrl.engine.choice import venv_name
    from clawrl.engine.vllm.engine import VLLMEngine
    from clawrl.engine.vllm.server import VLLMServer, vllm_command
    from clawrl.net import free_port
    from clawrl.types import Version

    v = VLLMConfig()
    python = str(Path.home() / ".cache" / "clawrl" / venv_name(False) / "bin" / "python")
    port = free_port()
    command = vllm_command(python, moved, port, v, 512, lora=False)
    log_path = moved.parent / "vllm.log"
    server = VLLMServer(v, f"http://127.0.0.1:{port}", command, log_path, reload_weights=True)
    started = time.monotonic()
    await asyncio.to_thread(server.connect)
    print(f"vLLM up in {time.monotonic() - started:.0f} s (log: {log_path})")
    engine = VLLMEngine(server, model_name="m", max_context=512, stop_token_ids=frozenset(), max_lora_rank=16,
                        full_weights=True)  # fmt: skip
    await engine.start()
    try:
        prompts = [list(range(200 + 37 * s, 240 + 37 * s)) for s in range(4)]
        fresh = await answers(engine, prompts)
        failed = 0
        for k in range(1, args.swaps + 1):
            folder = base if k % 2 else moved
            flying = [asyncio.create_task(in_flight(engine, 10 * k + i)) for i in range(args.streams)]
            await asyncio.sleep(1.0)  # decoding when the swap comes
            start = time.monotonic()
            await engine.serve_version(Version(f"v{k}", k, str(folder)))
            seconds = time.monotonic() - start
            results = await asyncio.gather(*flying)
            failed += sum(r != "ok" for r in results)
            now = await answers(engine, prompts)
            same = now == fresh
            print(f"swap {k} to {'base' if folder == base else 'moved copy'}: {seconds:.2f} s, "
                  f"in flight {len(results)}, failed {sum(r != 'ok' for r in results)}, "
                  f"answers == moved copy served fresh: {same}")  # fmt: skip
        print(f"failed requests: {failed}")
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args()
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    base = ensure_embedded(Config().cache_dir())
    with tempfile.TemporaryDirectory() as tmp:
        moved = moved_copy(base, Path(tmp) / "moved", args.noise)
        asyncio.run(run(args, base, moved))


if __name__ == "__main__":
    main()
