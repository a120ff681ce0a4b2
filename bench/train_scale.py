"""Trainer figures across processes and code versions: bench/train.py's `memory` and `processes` parts.

- memory: one `Trainer.step` of the embedded model on eval-like samples (8
  samples: 4 `rl`, 4 `opd`, ~200-token prompts, 128-token answers, KL on), in
  a fresh process per code version, so each peak RSS (`ru_maxrss`) is that
  step's alone. The baseline is another git revision (`--baseline-ref`, main
  by default) checked out with `git archive` and run in the same bench run.
- processes: `clawrl train --steps K` on a run folder holding K batches of the
  same samples, with 1 and with N ranks (`train.distributed.num_processes`);
  step time and training tokens/s come from the published versions' manifests
  (the first step, a warm-up, left out), and the trainer's peak RSS from the
  largest child process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from common import ROOT

from clawrl.types import Sample

STEP = r"""
import json, resource, sys, time
from dataclasses import fields
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import torch
import clawrl
from clawrl.config import TrainConfig
from clawrl.train.policy import build_policy
from clawrl.types import Sample
assert clawrl.__file__.startswith(sys.argv[1]), clawrl.__file__
torch.set_num_threads(int(sys.argv[4]))
names = {f.name for f in fields(Sample)}
rows = json.loads(Path(sys.argv[3]).read_text())
samples = [Sample(**{k: v for k, v in s.items() if k in names}) for s in rows]
policy = build_policy(Path(sys.argv[2]), TrainConfig(batch_size=len(samples)), "cpu")
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.perf_counter()
policy.trainer.step(samples)
took = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"loaded_mb": loaded, "peak_mb": peak, "step_s": took}))
"""


# Runs a command and prints the peak RSS (KB) of its largest process, ranks included (reaped in turn).
PEAK = r"""
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(done.returncode)
"""


def eval_like(n: int = 8, prompt: int = 200, response: int = 128, seed: int = 0) -> list[Sample]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(100, 40000, (prompt + 24 + response,), generator=gen).tolist()
        p, hint, r = ids[:prompt], ids[prompt : prompt + 24], ids[prompt + 24 :]
        opd = i % 2 == 1
        out.append(
            Sample(
                f"t{i}",
                "opd" if opd else "rl",
                p,
                r,
                [-8.0] * response,
                "v0",
                1.0,
                0.0 if opd else (1.0 if i % 4 == 0 else -1.0),
                teacher_prompt_ids=p + hint if opd else None,
            )
        )
    return out


def checkout(ref: str, into: Path) -> Path:
    """The tree of git revision `ref` of this repository, unpacked into `into`."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def step_memory(source: Path, model: Path, samples: list[Sample], threads: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump([s.__dict__ for s in samples], f)
        f.flush()
        cmd = [sys.executable, "-c", STEP, str(source), str(model), f.name, str(threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory(model: Path, baseline_ref: str, threads: int) -> dict:
    samples = eval_like()
    with tempfile.TemporaryDirectory() as tmp:
        base = step_memory(checkout(baseline_ref, Path(tmp)), model, samples, threads)
    return {"baseline": base, "this": step_memory(ROOT, model, samples, threads)}


def run_folder(tmp: Path, model: Path, samples: list[Sample], batch: int) -> Path:
    from clawrl.config import Config
    from clawrl.store.db import Store
    from clawrl.testing import make_turn

    config = Config(run_dir=tmp, model={"path": str(model)}, train={"batch_size": batch, "nice": 0})
    tmp.mkdir(parents=True)
    config.write()
    with Store.open(tmp / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        for i, s in enumerate(samples):
            store.insert_turn(make_turn(s.turn_id, "s1", i, created_at=10.0 + i))
        store.insert_samples(samples)
    return tmp


def processes(model: Path, counts: list[int], steps: int, threads: int) -> dict[int, dict]:
    """Per process count: median step seconds, tokens/s and the largest trainer process's peak RSS."""
    out = {}
    for n in counts:
        samples = [s for k in range(steps) for s in eval_like(seed=k)]
        for i, s in enumerate(samples):
            s.turn_id = f"t{i}"
        with tempfile.TemporaryDirectory() as tmp:
            run = run_folder(Path(tmp) / "run", model, samples, len(samples) // steps)
            cmd = [sys.executable, "-m", "clawrl", "train", "--run-dir", str(run), "--steps", str(steps)]
            cmd += ["--train.distributed.num-processes", str(n), "--train.threads", str(threads)]
            wrapped = [sys.executable, "-c", PEAK, *cmd]
            done = subprocess.run(wrapped, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            rss = float(done.stdout.strip().splitlines()[-1])
            metrics = [
                json.loads(p.read_text())["metrics"] for p in sorted(run.glob("checkpoints/v*/manifest.json"))
            ][1:]
        out[n] = {
            "step_s": statistics.median(m["step_s"] for m in metrics),
            "tokens_per_s": statistics.median(m["tokens_per_s"] for m in metrics),
            "peak_mb": rss / 1024,
        }
    return out
