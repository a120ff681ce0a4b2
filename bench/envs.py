"""Track 2's throughput on each engine: episodes a minute and the trainer's tokens a second.

Run: .venv/bin/python bench/envs.py [--env calculator] [--steps 2] [--group-size 8]
                                    [--batch-size 16] [--concurrency 4] [--engines local,vllm]
                                    [--json PATH]

For each engine, one after the other on the same machine, the same command a user runs:
`clawrl envs train --env ENV --split train --seed 0 ...` with the server it starts (the local
engine, then `--engine.kind vllm --engine.vllm.start true`: vLLM from scripts/setup-vllm's venv
decodes, the trainer stays in clawrl's process). Read back: episodes and the runner's wall time
from the report (server start not counted), each new version's trained tokens and step time
from the store. Printed: episodes/min, trained tokens/s, seconds a step, and vLLM's figures as
ratios of the local engine's (the machine is shared: only the ratios travel).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from clawrl.store.db import Store  # noqa: E402

# vLLM from the venv scripts/setup-vllm installs (clawrl finds it, as for bench/serve_vllm.py).
VLLM = ["--engine.kind", "vllm", "--engine.vllm.start", "true"]


def run(engine: str, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "clawrl", "envs", "train", "--env", args.env, "--split", "train"]
    cmd += ["--seed", "0", "--group-size", str(args.group_size), "--steps", str(args.steps)]
    cmd += ["--concurrency", str(args.concurrency), "--temperature", "0.8"]
    cmd += ["--train.batch-size", str(args.batch_size), "--out", str(out)]
    if engine == "vllm":
        cmd += VLLM
    print(f"{engine}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    with Store.open(out / "run" / "clawrl.db", readonly=True) as store:
        rows = [v.metrics for v in store.versions() if v.metrics]  # the trained ones (not v0)
    tokens = sum(m["tokens"] for m in rows)
    step_s = sum(m["step_s"] for m in rows)
    episodes = report["totals"]["episodes"]
    return {
        "engine": engine,
        "episodes": episodes,
        "wall_s": report["wall_s"],
        "versions": len(rows),
        "episodes_per_min": 60 * episodes / report["wall_s"],
        "trained_tokens": tokens,
        "train_tokens_per_s": tokens / step_s if step_s else 0.0,
        "step_s": step_s / len(rows) if rows else 0.0,
        "success_rate": report["totals"]["success_rate"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="calculator")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--engines", default="local,vllm")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-envs-") as tmp:
        for engine in args.engines.split(","):
            results.append(run(engine, Path(tmp) / engine, args))
    print(f"\n{args.env}, {args.steps} steps, G = {args.group_size}, batch {args.batch_size}")
    print("| engine | episodes | versions | episodes/min | trained tokens/s | s a step | success |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['engine']} | {r['episodes']} | {r['versions']} | {r['episodes_per_min']:.1f} "
            f"| {r['train_tokens_per_s']:.1f} | {r['step_s']:.0f} | {r['success_rate']:.0%} |"
        )
    base = results[0]
    for r in results[1:]:
        per_min = r["episodes_per_min"] / base["episodes_per_min"]
        per_s = r["train_tokens_per_s"] / max(base["train_tokens_per_s"], 1e-9)
        print(f"{r['engine']} / {base['engine']}: episodes/min {per_min:.2f}, trained tokens/s {per_s:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
