"""Seconds a trainer group waits per version: the synchronous whole save against the sharded async one.

Run: .venv/bin/python bench/sharded_saves.py [--versions 6] [--hidden 512 --layers 4] [--json PATH]

Two FSDP ranks under gloo on the CPU (as clawrl's tests run them), full fine-tuning of the tests'
tiny model (or, with `--hidden`, bench/fsdp_memory.py's random Llama of that width and `--layers`
layers, SmolLM2's vocabulary), AdamW. Each version is one training step (a forward and backward on
random tokens) and then its save, timed on every rank from the save's start until both ranks may
train on (a barrier: the group waits for rank 0's write):

- baseline, what the group did before: the whole float32 weights and AdamW state gathered to rank
  0 (`full_state`) and written with fsync as one version folder (`save_version`);
- sharded (clawrl/train/saves.py): bf16 weights gathered to rank 0 and written for serving, then
  every rank's shard of the training state handed to `dcp.async_save` (awaiting the previous
  save first), written while the next step runs; the last save's wait is counted too.

Printed: seconds per version (mean over versions, the slower rank), and the sharded figure as a
ratio to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from common import tiny_model
from fsdp_memory import make_model


def step(model, optimizer, vocab: int) -> None:
    import torch

    ids = torch.randint(0, vocab, (2, 64))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def rank_main(rank: int, port: int, model_dir: str, run: str, versions: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from clawrl.model.load import load_model
    from clawrl.train.checkpoints import save_version
    from clawrl.train.saves import ShardedSaves, serving_weights
    from clawrl.train.shards import full_state, shard_model

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    figures = {}
    for mode in ("baseline", "sharded"):
        torch.manual_seed(0)
        model = shard_model(load_model(Path(model_dir), "cpu", "float32").model.requires_grad_(True), False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        root = Path(run) / mode
        saves = ShardedSaves(root, model, optimizer, every=1) if mode == "sharded" else None
        vocab = model.get_input_embeddings().num_embeddings
        waited = 0.0
        for n in range(1, versions + 1):
            step(model, optimizer, vocab)
            start = time.perf_counter()
            manifest = {"step": n, "samples": [], "metrics": {}}
            if saves is None:
                state = full_state(model, optimizer)
            else:
                state = serving_weights(model)
                state = (state, None) if state is not None else None
            if rank == 0:
                save_version(root, f"v{n}", model, optimizer, manifest, state)
            if saves is not None:
                saves.save(f"v{n}")
            dist.barrier()
            waited += time.perf_counter() - start
        if saves is not None:
            start = time.perf_counter()
            saves.wait()
            dist.barrier()
            waited += time.perf_counter() - start
        figures[mode] = waited / versions
    box = [None, None]
    dist.all_gather_object(box, figures)
    if rank == 0:
        Path(out).write_text(json.dumps(box))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=0, help="a random Llama this wide (0: the tiny model)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.hidden:
            model = make_model(Path(tmp) / "model", args.hidden, args.layers)
        else:
            model = tiny_model(Path(tmp))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = Path(tmp) / "figures.json"
        mp.spawn(rank_main, args=(port, str(model), tmp, args.versions, str(out)), nprocs=2)
        ranks = json.loads(out.read_text())
    result = {mode: max(r[mode] for r in ranks) for mode in ("baseline", "sharded")}
    result["ratio"] = result["sharded"] / result["baseline"]
    shape = f"random Llama {args.hidden} wide, {args.layers} layers" if args.hidden else "tiny (tests)"
    print(f"model: {shape}, 2 FSDP ranks (gloo, CPU), {args.versions} versions")
    print(f"baseline (whole state to rank 0, fsynced): {result['baseline']:.3f} s waited per version")
    print(f"sharded async (bf16 version + DCP shards): {result['sharded']:.3f} s waited per version")
    print(f"ratio sharded / baseline: {result['ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
