"""Adapters at 1, 10 and 100 users (issue 57 item 2): what the server holds for them, and a swap's cost.

Two parts:

- GPU shapes (Qwen3-4B, -8B, bench/models), arithmetic from clawrl/model/adapter_slots.py, the code
  the memory budget counts with: vLLM's slots on the GPU and its CPU cache in pinned host memory,
  before (`--max-loras` users + 2, nothing counted) and now (at most 16 slots); the local engine's
  stack on the GPU, before (float32, a slot per served user) and now (bf16, preallocated).
- The CPU's embedded model (SmolLM2-135M, float32 here), measured: the bytes of tensors the local
  engine's adapter stack holds with every served user on a rank-16 adapter, and the seconds one
  user's swap takes (median of `--swaps`), now against the stack as it was at e18cf6e (its source
  read from git and run in this process, the baseline in the same run); and the largest logprob
  difference between the two on a batch of three users' rows (the served outputs).

    nice -n 15 .venv/bin/python bench/adapter_slots.py            # 1, 10, 100 users
    nice -n 15 .venv/bin/python bench/adapter_slots.py --users 1 10 --swaps 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import types
from pathlib import Path

from clawrl.config import Config
from clawrl.model.adapter_slots import adapter_memory
from clawrl.model.budget import TARGETS, Shape
from clawrl.model.load import ensure_embedded

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "e18cf6e"  # the last commit with the stack that rebuilt every slot on a swap
MODELS = ROOT / "bench" / "models"


def config_for(users: int, tmp: Path, engine: str) -> Config:
    path = tmp / f"users-{users}.json"
    path.write_text(json.dumps({f"user{i}": f"key-{i:04d}-{'x' * 16}" for i in range(users)}))
    vllm = {"kind": "vllm", "vllm": {"url": "http://127.0.0.1:9"}} if engine == "vllm" else {"kind": "local"}
    return Config(server={"users": path}, engine=vllm)


def gpu_shapes(user_counts: list[int], tmp: Path) -> None:
    print("GPU shapes, rank 16 on every projection, bf16 (arithmetic: clawrl/model/adapter_slots.py)")
    print(f"{'model':>9} {'users':>5} | {'vLLM before: GPU':>16} {'now: GPU':>13} {'host':>8} "
          f"| {'local before':>12} {'now':>8}")  # fmt: skip
    for name in ("qwen3-4b", "qwen3-8b"):
        shape = Shape.from_config(json.loads((MODELS / f"{name}.json").read_text()))
        slot = shape.lora_params(16, TARGETS) * 2
        for users in user_counts:
            vllm = adapter_memory(config_for(users, tmp, "vllm"), shape, "vllm", 2)
            local = adapter_memory(config_for(users, tmp, "local"), shape, "local", 2)
            before_vllm = (users + 2) * slot  # --max-loras users + 2, every slot preallocated
            before_local = (users + 2) * slot * 2  # float32: slot 0 and each served user's
            print(
                f"{name:>9} {users:>5} | {gb(before_vllm):>16} {gb(vllm.device):>8} ({vllm.slots:>2}) "
                f"{gb(vllm.host):>8} | {gb(before_local):>12} {gb(local.device):>8}"
            )
        print(f"{'':>9} a slot: {slot / 1e6:.1f} MB")


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def old_stack_module() -> types.ModuleType:
    """clawrl/engine/local/stack.py as it was at BEFORE, as a module of this process."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BEFORE}:clawrl/engine/local/stack.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("stack_before")
    exec(compile(source, "stack_before.py", "exec"), module.__dict__)
    return module


def random_adapter(linears: dict, rank: int, seed: int) -> dict:
    import torch

    from clawrl.version_folder import LoraDelta

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, m in linears.items():
        o, i = m.weight.shape
        out[name] = LoraDelta(
            torch.randn(rank, i, generator=g) / 30, torch.randn(o, rank, generator=g) / 30, 2.0
        )
    return out


def measure(users: int, swaps: int, rank: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from clawrl.engine.local.merge import _linears
    from clawrl.engine.local.stack import AdapterStack
    from clawrl.version_folder import DEFAULT_TARGETS

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    folder = ensure_embedded(Config().cache_dir())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    linears = _linears(model, tuple(DEFAULT_TARGETS))
    # Two adapters' tensors shared by every user keep this machine's memory low; each user's
    # read_adapter gives them their own, so the old stack's held adapters count once a user.
    pool = [random_adapter(linears, rank, seed) for seed in (1, 2)]
    served = ["default"] + [f"user{i}" for i in range(users)]
    adapter_bytes = sum(d.a.numel() * 4 + d.b.numel() * 4 for d in pool[0].values())
    ids = torch.tensor([[1, 504, 3458, 28, 253, 1789, 30, 2]]).expand(3, -1)
    rows = [served[-1], served[0], "nobody"]  # a swapped user, another user, one on the base
    out: dict[str, float] = {}
    for kind in ("before", "now"):
        if kind == "before":
            stack = old_stack_module().AdapterStack(model, DEFAULT_TARGETS)
            stack._slots = {u: k + 1 for k, u in enumerate(served)}  # every user served, built once
            stack._deltas = [{}] + [pool[k % 2] for k in range(len(served))]
            stack._stack = stack._restack()
        else:
            stack = AdapterStack(model, DEFAULT_TARGETS, slots=len(served) + 1, rank=rank)
            for k, user in enumerate(served):
                stack.apply(user, pool[k % 2])
        held = stack.bytes + (adapter_bytes * len(served) if kind == "before" else 0)
        times = []
        for s in range(swaps):
            start = time.perf_counter()
            stack.apply(served[-1], pool[(s + len(served)) % 2])  # the last user's new version
            times.append(time.perf_counter() - start)
        with torch.no_grad(), stack.rows(rows):
            logprobs = torch.log_softmax(model(ids).logits.float(), -1)
        out[f"{kind} bytes"], out[f"{kind} swap s"] = held, statistics.median(times)
        out[f"{kind} logprobs"] = logprobs  # type: ignore[assignment]
        del stack
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32
        ).eval()  # no wrapped forwards
        linears = _linears(model, tuple(DEFAULT_TARGETS))
    diff = (out.pop("before logprobs") - out.pop("now logprobs")).abs().max().item()  # type: ignore[operator]
    out["logprob diff"] = diff
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, nargs="+", default=[1, 10, 100], help="users in the users file")
    p.add_argument("--swaps", type=int, default=3, help="swaps timed at each count (the median)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads: 1 on a shared machine (2 threads' spinning made the old rebuild 20x slower)",
    )  # fmt: skip
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        gpu_shapes(args.users, Path(tmp))
    print("\nCPU: the embedded model, float32; every served user (the users and the default) on an adapter")
    print(f"{'users':>5} | {'held before':>11} {'now':>9} {'ratio':>6} | {'swap before':>11} {'now':>9} "
          f"{'ratio':>6} | max |logprob diff|")  # fmt: skip
    for users in args.users:
        f = measure(users, args.swaps, args.rank)
        print(
            f"{users:>5} | {gb(f['before bytes']):>11} {gb(f['now bytes']):>9} "
            f"{f['now bytes'] / f['before bytes']:>6.2f} | {f['before swap s']:>9.4f} s "
            f"{f['now swap s']:>7.4f} s "
            f"{f['now swap s'] / f['before swap s']:>6.3f} | {f['logprob diff']:.1e}",
            flush=True,
        )
    print(f"({args.threads} torch thread(s); the machine is shared: swap seconds move with its load)")


if __name__ == "__main__":
    main()
