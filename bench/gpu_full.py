"""Full fine-tuning past one step, against LoRA on the same samples, through clawrl's trainer.

bench/gpu.py measures the default (LoRA); this measures `--train.weights full` at the same
shapes (random weights, nothing downloaded): several `Trainer.step`s of a policy from
`build_policy`, on a GPU in bf16 on float32 master weights (train/master.py), then the version
written as the trainer writes it and read back. Baseline: as many LoRA steps (clawrl's default)
on the same samples, measured first in the same run; a ratio is of the fastest steps. Checked (the
run stops otherwise): every step's loss and gradient norm finite, each bf16 weight its master
rounded once (on a GPU), the version read back equal to the weights trained. Memory: the peak
beside the trainer's arithmetic in the memory budget (`clawrl/model/budget.py`, `TrainerNeed.need`),
which `clawrl serve` reserves before loading.

    .venv/bin/python bench/gpu_full.py [--shape 4b | --shape tiny] [--steps 3] [--json out.json]

Without CUDA it runs the tiny shape in float32 at CPU lengths (what CI runs,
tests/service/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.gpu import LR, SHAPES, build_folder, model_config, release, sync  # noqa: E402
from bench.gpu_common import Scale, memory_mb, random_ids, train_samples  # noqa: E402
from bench.scale_table import Shape  # noqa: E402

GPU_SCALE = Scale(streams=(1,), decode_prompt=0, decode_tokens=0, prefill=0, train_seq=4096,
                  train_response=512, train_samples=4)  # fmt: skip
CPU_SCALE = Scale(streams=(1,), decode_prompt=0, decode_tokens=0, prefill=0, train_seq=128,
                  train_response=32, train_samples=4)  # fmt: skip


def timed_steps(policy: Any, samples: list[Any], device: str, steps: int) -> dict[str, Any]:
    """A warm-up step, then `steps` timed ones; each step's seconds, loss and gradient norm."""
    import torch

    policy.trainer.step(samples[:1])
    release(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, losses, norms = [], [], []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        metrics = policy.trainer.step(samples)
        sync(device)
        seconds.append(time.perf_counter() - start)
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
    if not all(math.isfinite(x) for x in losses + norms):
        raise RuntimeError(f"a step was not finite: losses {losses}, gradient norms {norms}")
    return {"step_s": seconds, "loss": losses, "grad_norm": norms, "peak_mb": memory_mb(device, peak=True)}


def masters_hold(policy: Any) -> bool:
    """Each bf16 weight is its float32 master rounded once (vacuously true without masters)."""
    import torch

    master = policy.trainer.master
    return master is None or all(torch.equal(w, m.to(w.dtype)) for w, m in master.pairs)


def round_trip(policy: Any, run_dir: Path) -> dict[str, Any]:
    """Write the trained weights as a version, load the base, then the version: equal again."""
    import torch

    from clawrl.train.checkpoints import save_version

    trained = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    start = time.perf_counter()
    manifest = {"step": 1, "samples": 4, "metrics": {}}
    folder = save_version(run_dir, "v1", policy.model, policy.optimizer, manifest)
    saved = time.perf_counter() - start
    policy.load(None)
    moved = any(not torch.equal(v, trained[k]) for k, v in policy.model.state_dict().items())
    start = time.perf_counter()
    policy.load(folder)
    loaded = time.perf_counter() - start
    same = all(torch.equal(v, trained[k]) for k, v in policy.model.state_dict().items())
    if not (moved and same and masters_hold(policy)):
        raise RuntimeError(f"the version did not read back as trained (moved {moved}, same {same})")
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return {"save_s": saved, "load_s": loaded, "version_mb": size / 2**20}


def need_mb(shape: Shape, params: int, weights: str, tokens: int) -> float:
    from clawrl.model.budget import TrainerNeed

    return TrainerNeed(weights=weights, tokens=tokens).need(shape, params) / 2**20  # type: ignore[arg-type]


def run_shape(name: str, tokenizer_dir: Path, device: str, steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from clawrl.config import TrainConfig
    from clawrl.train.policy import build_policy

    scale = GPU_SCALE if device == "cuda" else CPU_SCALE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = model_config(name, tokenizer)
    shape = Shape.from_config(name, cfg)
    gen = torch.Generator().manual_seed(0)
    samples = train_samples(scale, shape.vocab, lambda n: random_ids(n, shape.vocab, gen))
    common = {"lr": LR, "micro_batch_tokens": scale.train_seq, "max_seq_len": scale.train_seq}
    out: dict[str, Any] = {"shape": name, "device": device, "samples": len(samples), "seq": scale.train_seq}
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-full-") as tmp:
        folder = build_folder(cfg, tokenizer, Path(tmp) / "model", device, dtype)
        params = shape.params()
        for weights in ("lora", "full"):
            start = time.perf_counter()
            policy = build_policy(folder, TrainConfig(weights=weights, **common), device)
            built = time.perf_counter() - start
            figures = timed_steps(policy, samples, device, steps)
            figures |= {"build_s": built, "need_mb": need_mb(shape, params, weights, scale.train_seq)}
            if weights == "full":
                if not masters_hold(policy):
                    raise RuntimeError("a bf16 weight is not its master rounded once")
                figures |= {"masters": policy.trainer.master is not None}
                figures |= round_trip(policy, Path(tmp) / "run")
            out[weights] = figures
            del policy
            release(device)
    lora, full = out["lora"], out["full"]
    out["full_step_ratio"] = min(full["step_s"]) / min(lora["step_s"])
    out["full_peak_ratio"] = full["peak_mb"] / lora["peak_mb"]
    return out


def report(r: dict[str, Any]) -> str:
    lora, full = r["lora"], r["full"]
    steps = ", ".join(f"{s:.2f}" for s in full["step_s"])
    base = ", ".join(f"{s:.2f}" for s in lora["step_s"])
    losses = ", ".join(f"{x:.4f}" for x in full["loss"])
    return "\n".join([
        f"{r['shape']} on {r['device']}: {r['samples']} samples x {r['seq']:,} tokens a step",
        f"LoRA, {len(lora['step_s'])} steps (baseline) {base} s; peak {lora['peak_mb']:,.0f} MB "
        f"(budget's arithmetic {lora['need_mb']:,.0f} MB)",
        f"full, {len(full['step_s'])} steps            {steps} s ({r['full_step_ratio']:.2f}x LoRA); "
        f"losses {losses}",
        f"  memory                  peak {full['peak_mb']:,.0f} MB ({r['full_peak_ratio']:.2f}x LoRA; "
        f"budget's arithmetic {full['need_mb']:,.0f} MB, {full['peak_mb'] / full['need_mb']:.2f} of it)",
        f"  bf16 on float32 masters {full['masters']}; built in {full['build_s']:.1f} s",
        f"  version                 {full['version_mb']:,.0f} MB written in {full['save_s']:.1f} s, "
        f"read back equal in {full['load_s']:.1f} s",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), help="default: 4b on CUDA, else tiny")
    p.add_argument("--steps", type=int, default=3, help="timed full fine-tuning steps (default 3)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the embedded model's)")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = p.parse_args(argv)
    import torch

    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = args.shape or ("4b" if device == "cuda" else "tiny")
    tokenizer = args.tokenizer or ensure_embedded(Config().cache_dir())
    result = run_shape(shape, tokenizer, device, args.steps)
    print(report(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
