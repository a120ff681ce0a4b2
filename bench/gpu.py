"""Serving and training figures at the scale users run (Qwen3-4B and -8B shapes), through clawrl's code.

Models: random weights on the real Qwen3 shapes kept in `bench/models/` (nothing is downloaded),
with the embedded model's tokenizer and chat template (the engine and the canary render and
decode with it; the Qwen3 vocabulary is larger, and random token ids above the tokenizer's
are fine for random prompts). bf16 on CUDA. Without CUDA, `--shape tiny` runs the same
measurements on a 2-layer, 128-wide Qwen3 with the tokenizer's vocabulary, in float32, at
scaled-down lengths, in seconds: what CI runs (tests/service/test_bench_gpu.py).

What is measured, each through the code a server and its trainer run:

- decode: N concurrent `LocalEngine.generate` streams (ignore_eos, every completion the same
  length), built by `build_local_engine` from a `Config`; tokens/s over the phase's wall time.
  Baseline: 1 stream. `engine.max_batch_size` is raised to the largest N (default: 16).
- prefill: one long prompt through the engine (chunked, as served) until its first token.
  Baseline: a bare Hugging Face forward of the same length on the same model, which also gives
  the KV cache's bytes per token, checked against the formula of `bench/scale_table.py`.
- train: one `Trainer.step` of a policy from `build_policy` (LoRA, clawrl's defaults: KL on,
  half `rl` half `opd` samples as `combine` makes them), one sample per micro-batch, after a
  one-sample warm-up step. Peak memory: `torch.cuda.max_memory_allocated` (on a CPU the
  process's peak RSS, which includes everything loaded before). Baseline: the bare forward.
- publish to serve: the version folder written as the trainer writes it (publish lock, name,
  `save_version`, the store row), then `LocalEngine.serve_version` until it returns; one more
  token checks that it comes from the new version. The server's watcher finds a version within
  `train.swap_poll_s` (1 s), which is not counted. Baseline: the training step.
- canary: the gate the trainer runs after a step (`clawrl.guard.trainer_hooks`), with KL on
  `guard.kl_turns` recorded turns: the first check (it also measures the base) and the next.
  Baseline: the training step.
- the workload an agent's server meets (bench/gpu_workload.py): prompts of unequal lengths up
  to 13k tokens decoded with Qwen3's sampling defaults, decode once v1 is served, the p99
  inter-token time while a trainer process steps beside the engine (each process's peak
  memory), and the train-vs-serve logprob mismatch and importance weights at v0.

    .venv/bin/python bench/gpu.py [--shape 4b --shape 8b | --shape tiny] [--json out.json]

The built model's parameter count, its LoRA adapter's and its KV bytes per token are checked
against `bench/scale_table.py`'s formulas (what docs/scale.md is made of); a mismatch stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.gpu_common import Scale, memory_mb, random_ids, train_samples  # noqa: E402
from bench.gpu_report import report  # noqa: E402
from bench.scale_table import Shape, load_config  # noqa: E402

GPU_SCALE = Scale(streams=(1, 8, 32), decode_prompt=256, decode_tokens=128, prefill=16384,
                  train_seq=16384, train_response=512)  # fmt: skip
CPU_SCALE = Scale(streams=(1, 4, 8), decode_prompt=32, decode_tokens=16, prefill=256,
                  train_seq=256, train_response=32, long_prompt=256, long_streams=4)  # fmt: skip
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096}  # fmt: skip
SHAPES = {"4b": ("qwen3-4b", {}), "8b": ("qwen3-8b", {}), "tiny": ("qwen3-4b", TINY)}
LR = 1e-5  # any finite rate: the step's cost does not depend on it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--shape", action="append", choices=sorted(SHAPES), help="default: 4b and 8b on CUDA, else tiny"
    )
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the embedded model's)")
    return p.parse_args(argv)


# --- the model --------------------------------------------------------------------------------


def model_config(shape: str, tokenizer: Any) -> dict:
    """The shape's config.json, its token ids the tokenizer's (tiny: its vocabulary too)."""
    name, overrides = SHAPES[shape]
    cfg = load_config(name) | overrides
    if shape == "tiny":
        cfg["vocab_size"] = len(tokenizer)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return cfg | {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, "pad_token_id": pad}


def build_folder(cfg: dict, tokenizer: Any, out: Path, device: str, dtype: Any) -> Path:
    """A model folder with random weights (initialised on `device`) and the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    release(device)
    return out


def release(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# --- serving ------------------------------------------------------------------------------------


async def stream(engine: Any, prompt: list[int], max_tokens: int) -> list[Any]:
    from clawrl.engine.base import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [event async for event in engine.generate(prompt, params)]


async def decode(engine: Any, scale: Scale, ids: Any) -> dict[str, float]:
    """Tokens/s of N concurrent streams, for each N; each N's ratio to the first."""
    out: dict[str, float] = {}
    for n in scale.streams:
        prompts = [ids(scale.decode_prompt) for _ in range(n)]
        start = time.perf_counter()
        done = await asyncio.gather(*(stream(engine, p, scale.decode_tokens) for p in prompts))
        out[f"decode_{n}_tok_s"] = sum(len(d) for d in done) / (time.perf_counter() - start)
    for n in scale.streams[1:]:
        out[f"decode_{n}_ratio"] = out[f"decode_{n}_tok_s"] / out[f"decode_{scale.streams[0]}_tok_s"]
    return out


def bare_prefill(model: Any, prompt: list[int], device: str) -> tuple[float, int]:
    """(seconds, KV cache bytes) of one plain forward over `prompt`."""
    import torch

    with torch.inference_mode():
        x = torch.tensor([prompt], device=model.device)
        sync(device)
        start = time.perf_counter()
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        sync(device)
        took = time.perf_counter() - start
        kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
    return took, kv


async def engine_prefill(engine: Any, prompt: list[int], device: str) -> float:
    """Seconds from the request to its first token (a prompt this long is prefilled in chunks)."""
    sync(device)
    start = time.perf_counter()
    await stream(engine, prompt, 1)
    return time.perf_counter() - start


async def prefill(engine: Any, scale: Scale, ids: Any, device: str) -> dict[str, float]:
    n = scale.prefill
    bare_prefill(engine.model, ids(n), device)  # warm-up, both ways
    await engine_prefill(engine, ids(n), device)
    bare, kv = bare_prefill(engine.model, ids(n), device)
    took = await engine_prefill(engine, ids(n), device)
    return {
        "prefill_s": took,
        "prefill_tok_s": n / took,
        "bare_prefill_s": bare,
        "bare_prefill_tok_s": n / bare,
        "prefill_ratio": bare / took,
        "kv_bytes_per_token": kv / n,
    }


# --- training, publishing, the canary ----------------------------------------------------------


def train(policy: Any, samples: list[Any], device: str, bare_tok_s: float) -> dict[str, float]:
    import torch

    policy.trainer.step(samples[:1])  # warm-up: kernels, the optimizer's state
    release(device)
    before = memory_mb(device, peak=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    start = time.perf_counter()
    metrics = policy.trainer.step(samples)
    sync(device)
    took = time.perf_counter() - start
    tokens = sum(
        max(len(s.prompt_ids), len(s.teacher_prompt_ids or [])) + len(s.response_ids) for s in samples
    )
    return {
        "train_step_s": took,
        "train_tok_s": tokens / took,
        "train_response_tok_s": metrics["tokens"] / took,
        "train_ratio": tokens / took / bare_tok_s,
        "train_memory_before_mb": before,
        "train_peak_mb": memory_mb(device, peak=True),
    }


async def publish(engine: Any, policy: Any, run_dir: Path, store: Any, ids: Any) -> dict[str, float]:
    """Write v1 as the trainer does, then have the engine serve it; checks the next token is v1's."""
    from clawrl.train.checkpoints import claim_next, publish_lock, save_version
    from clawrl.types import Version

    start = time.perf_counter()
    with publish_lock(run_dir):
        name = claim_next(run_dir, store.latest_version().number)
        manifest = {"step": 1, "samples": [], "metrics": {}, "parent": "v0"}
        path = save_version(run_dir, name, policy.model, policy.optimizer, manifest)
        version = Version(name, 1, str(path), {}, "v0")
        store.publish_version(version, trained=[])
    saved = time.perf_counter()
    await engine.serve_version(version)
    served = time.perf_counter()
    served_by = (await stream(engine, ids(8), 1))[0].version
    if served_by != name:
        raise RuntimeError(f"after the swap the engine served {served_by}, not {name}")
    return {"publish_s": served - start, "publish_save_s": saved - start, "publish_swap_s": served - saved}


def record_turns(store: Any, scale: Scale, ids: Any) -> None:
    """Recorded main turns for the canary's KL (it reads their last prompt and first answer tokens)."""
    from clawrl.testing import make_turn

    store.upsert_session("s1", "bench", 1.0)
    for i in range(scale.kl_turns):
        response = ids(32)
        at = {"created_at": 10.0 + i, "finished_at": 11.0 + i}
        prompt = ids(scale.decode_prompt)
        store.insert_turn(make_turn(f"k{i}", "s1", i, prompt_ids=prompt, response_ids=response, **at))


def canary(config: Any, store: Any, policy: Any, folder: Path) -> dict[str, float]:
    from clawrl.guard import trainer_hooks

    check, _ = trainer_hooks(config, store, policy, folder, check=True)
    assert check is not None
    _, first = check(policy)
    _, again = check(policy)
    return {"canary_first_s": first["seconds"], "canary_s": again["seconds"]}


# --- one shape ----------------------------------------------------------------------------------


async def measure(config: Any, folder: Path, shape: Shape, scale: Scale, device: str) -> dict[str, float]:
    import torch

    from bench import gpu_workload as workload
    from clawrl.engine.local.build import build_local_engine
    from clawrl.store.db import Store
    from clawrl.train.policy import build_policy

    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return random_ids(n, shape.vocab, gen)

    engine, _ = build_local_engine(config)
    await engine.start()
    try:
        figures = {"params": sum(p.numel() for p in engine.model.parameters())}
        await stream(engine, ids(scale.decode_prompt), 4)  # warm-up
        figures |= await decode(engine, scale, ids)
        figures |= await workload.long_prompt_decode(engine, scale, ids, figures)
        figures |= await prefill(engine, scale, ids, device)
        policy = build_policy(folder, config.train, device)
        figures["lora_params"] = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
        figures |= await workload.mismatch_at_v0(engine, policy, scale, ids)
        samples = train_samples(scale, shape.vocab, ids)
        figures |= train(policy, samples, device, figures["bare_prefill_tok_s"])
        with Store.open(config.run_dir / "clawrl.db") as store:
            figures |= await publish(engine, policy, config.run_dir, store, ids)
            figures |= await workload.decode_after_publish(engine, scale, ids, figures)
            record_turns(store, scale, ids)
            figures |= canary(config, store, policy, folder)
        del policy, samples  # the trainer's process of serve_while_training loads its own
        release(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        figures |= await workload.serve_while_training(engine, config, scale, ids, device)
    finally:
        await engine.stop()
        engine.close()
    step = figures["train_step_s"]
    return figures | {
        "publish_ratio": figures["publish_s"] / step,
        "canary_ratio": figures["canary_s"] / step,
    }


CHECKED = ("params", "lora_params", "kv_bytes_per_token")  # measured, and given by a formula


def formulas(shape: Shape, lora: Any, element_bytes: int) -> dict[str, int]:
    """What bench/scale_table.py (and so docs/scale.md) says the built model has."""
    return {
        "params_formula": shape.params(),
        "lora_params_formula": shape.lora_params(lora.rank, tuple(lora.targets)),
        "kv_bytes_per_token_formula": shape.kv_bytes_per_token(element_bytes),
    }


def run_shape(shape_name: str, tokenizer_dir: Path, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from clawrl.config import Config

    scale = GPU_SCALE if device == "cuda" else CPU_SCALE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = model_config(shape_name, tokenizer)
    shape = Shape.from_config(shape_name, cfg)
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-gpu-") as tmp:
        folder = build_folder(cfg, tokenizer, Path(tmp) / "model", device, dtype)
        config = Config(
            run_dir=Path(tmp) / "run",
            model={"path": str(folder), "device": device},
            engine={"max_batch_size": max(16, *scale.streams)},
            train={"lr": LR, "micro_batch_tokens": scale.train_seq, "max_seq_len": scale.train_seq},
            guard={"kl_turns": scale.kl_turns},
        )
        config.run_dir.mkdir(parents=True)
        figures = asyncio.run(measure(config, folder, shape, scale, device))
    release(device)
    figures |= formulas(shape, config.train.lora, torch.finfo(dtype).bits // 8)
    if wrong := [k for k in CHECKED if figures[k] != figures[f"{k}_formula"]]:
        raise RuntimeError(f"{shape_name}: the built model disagrees with bench/scale_table.py on {wrong}")
    settings = asdict(scale) | {"dtype": str(dtype).removeprefix("torch."), "device": device, "lr": LR}
    return {"shape": asdict(shape), "settings": settings, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = args.shape or (["4b", "8b"] if device == "cuda" else ["tiny"])
    tokenizer = args.tokenizer or ensure_embedded(Config().cache_dir())
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results = {}
    for shape in shapes:
        print(f"{shape}: building and measuring on {name} ...", flush=True)
        results[shape] = run_shape(shape, tokenizer, device)
        print("\n" + report(shape, results[shape]) + "\n", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"device": name, "torch": torch.__version__, "shapes": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
