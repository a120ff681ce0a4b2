"""Memory per rank: full fine-tuning under FSDP with 2 ranks against one process, on the CPU (gloo).

Run: .venv/bin/python bench/fsdp_memory.py [--hidden 1024] [--layers 6] [--baseline-ref main] [--json PATH]

A random Llama with the embedded tokenizer, big enough that its weights dominate a trainer's
memory (1024 wide, 6 layers, SmolLM2's 49,152-token vocabulary: 126M parameters, 0.5 GB in
float32), saved in bf16 as released checkpoints are. `clawrl train --steps 1` with
`train.weights = "full"` (AdamW, KL against the frozen reference; no canary) on the same 6
samples, in a fresh process each:

- one process;
- 2 FSDP ranks (`CLAWRL_FSDP_ON_CPU=1`, what clawrl's tests set), this code: each rank builds the
  model and its reference on the meta device and reads its shards from the checkpoint;
- 2 FSDP ranks with `--baseline-ref` (a git revision, default main; "" skips it): what the
  code there does.

Printed per run and rank, each also as a ratio to one process's figure from the same run (RSS
high-water marks, MiB):

- loaded: VmHWM from /proc when rank 0 logs the step's start: the model and its reference loaded
  (before this code, each rank's whole copies of both too);
- at the step's end: the version's `peak_rss_mb` (this code only), the load and the step;
- whole run: VmHWM sampled every 0.1 s, for any code: under FSDP, rank 0's includes the gather of
  the whole weights and AdamW state into host memory that writes the version.

On a GPU that gather goes to host memory, not the GPU's, so the step's figure is the one that
sizes a GPU; there each rank also records `peak_gpu_mb`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT
from train_scale import checkout, eval_like, run_folder

from clawrl.config import Config
from clawrl.model.load import ensure_embedded


def make_model(out: Path, hidden: int, layers: int) -> Path:
    """A random Llama of `hidden` width and `layers` layers with the embedded tokenizer, in bf16."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded(Config().cache_dir()))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train(source: Path, model: Path, run: Path, processes: int) -> dict:
    """`clawrl train --steps 1` (full weights) from the code in `source`: its peaks, in MiB."""
    samples = eval_like(n=6, prompt=96, response=32)
    run_folder(run, model, samples, len(samples))
    cmd = [sys.executable, "-m", "clawrl", "train", "--run-dir", str(run), "--steps", "1"]
    cmd += ["--train.weights", "full", "--guard.enabled", "false", "--train.threads", "1"]
    cmd += ["--train.distributed.num-processes", str(processes)]
    if processes > 1:
        cmd += ["--train.distributed.strategy", "fsdp"]
    env = os.environ | {"CLAWRL_FSDP_ON_CPU": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        lifetime: dict[int, float] = {}
        loaded: dict[int, float] = {}
        while proc.poll() is None:
            for pid, rank in ranks(proc.pid, processes):
                lifetime[rank] = max(lifetime.get(rank, 0.0), high_water_mb(pid))
            if not loaded:
                log.seek(0)
                if "step 1: training" in log.read():  # rank 0 starts the step: every rank has loaded
                    loaded = dict(lifetime)
            time.sleep(0.1)
        log.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(log.read()[-3000:])
    metrics = json.loads((run / "checkpoints" / "v1" / "manifest.json").read_text())["metrics"]
    return {
        "loaded_mb": [loaded[r] for r in sorted(loaded)],
        "step_mb": metrics.get("peak_rss_mb"),
        "lifetime_mb": [lifetime[r] for r in sorted(lifetime)],
    }


def ranks(pid: int, processes: int) -> list[tuple[int, int]]:
    """(pid, rank) of the trainer's ranks: `pid` itself alone, else its descendants with a RANK."""
    if processes == 1:
        return [(pid, 0)]
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            env = dict(
                e.split("=", 1) for e in (Path(f"/proc/{p}/environ").read_text().split("\0")) if "=" in e
            )
        except OSError:
            continue
        if "RANK" in env and "clawrl" in Path(f"/proc/{p}/cmdline").read_text(errors="replace"):
            out.append((p, int(env["RANK"])))
    return out


def high_water_mb(pid: int) -> float:
    """The process's resident high-water mark (VmHWM), MiB; 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--baseline-ref", default="main", help='a git revision for FSDP before; "": none')
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as tmp:
        model = make_model(Path(tmp) / "model", args.hidden, args.layers)
        out = {
            "one process": train(ROOT, model, Path(tmp) / "one", 1),
            "2 FSDP ranks": train(ROOT, model, Path(tmp) / "two", 2),
        }
        if args.baseline_ref:
            source = checkout(args.baseline_ref, Path(tmp) / "baseline")
            out[f"2 FSDP ranks ({args.baseline_ref})"] = train(source, model, Path(tmp) / "before", 2)
    one = {key: figures[0] for key, figures in out["one process"].items()}
    for name, figures in out.items():
        print(f"{name}:")
        for key, what in (
            ("loaded_mb", "loaded"),
            ("step_mb", "at the step's end"),
            ("lifetime_mb", "whole run"),
        ):
            ranked = enumerate(figures[key] or [])
            cells = ", ".join(f"rank {r} {mb:.0f} MiB ({mb / one[key]:.2f}x)" for r, mb in ranked)
            print(f"  {what}: {cells or 'not recorded'}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
