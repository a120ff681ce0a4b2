"""Sharded, asynchronous saves of a trainer group's full-weight training state (torch's DCP).

Full fine-tuning over several ranks keeps two things apart:

- each version folder (`checkpoints/vN/`, the format the server reads) holds the weights for
  serving only, in bf16 (`serving_weights`: each weight gathered to rank 0 already cast, half the
  bytes of float32), and no `optimizer.pt`;
- the training state (the float32 weights AdamW updates and AdamW's moments, 12 bytes a
  parameter: 98 GB at 8B) is written every `train.distributed.save_every` versions by every rank,
  each its own shard (a DDP rank: its share of the replicated tensors), with
  `torch.distributed.checkpoint.async_save`, into `<run_dir>/train-state/vN/`. The call copies
  the rank's state to host memory and returns; the files are written by a thread while the group
  trains on. A save is awaited before the next one starts (never two at once) and when the loop
  stops.

A save is complete once its `.metadata` is written: DCP writes it last, on rank 0, after every
rank's files are on disk, through a temporary file renamed into place. A crash mid-save leaves a
folder without one, which nothing loads.

Loading version V (`restore`, after its folder's weights are loaded) looks for the newest complete
save along V's lineage (each manifest's `parent`; a rollback is its source's state): V's own (or
the state a rollback copied) gives the exact float32 weights and AdamW moments the group had; an
older one gives AdamW's moments only, the weights staying V's bf16 ones (a version between two
saves, or one whose save a crash cut short), as a version without `optimizer.pt` starts a fresh
optimizer. The saves' collectives run on a gloo group of their own (`dist.new_group`), so the
writing thread never interleaves its messages with the step's on the default group; loading needs
none (`no_dist`): rank 0 loads a version before the others learn of it (train/loop.py).

The newest `KEEP` complete saves are kept; older ones, and incomplete ones older than the newest
complete, are removed by rank 0 once a save completes.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clawrl.version_folder import MANIFEST, version_dir, version_number

log = logging.getLogger("clawrl.trainer")

SAVES = "train-state"  # <run_dir>/train-state/vN/: one sharded save of the training state
METADATA = ".metadata"  # DCP's, written last: a save without it is incomplete
KEEP = 2  # complete saves kept: the newest, and one before it should the newest not load


def saves_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SAVES


def is_complete(folder: Path) -> bool:
    return (folder / METADATA).is_file()


def parent_of(run_dir: Path) -> Callable[[str], tuple[str | None, bool]]:
    """A version's predecessor from its manifest, and whether it holds the same weights (a rollback
    copies its source's); (None, False) at v0 or an unreadable manifest."""
    import json

    def parent(name: str) -> tuple[str | None, bool]:
        try:
            manifest = json.loads((version_dir(run_dir, name) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None, False
        if manifest.get("rollback_of"):
            return manifest["rollback_of"], True
        return manifest.get("parent"), False

    return parent


def newest_save(
    root: Path, version: str, parent: Callable[[str], tuple[str | None, bool]]
) -> tuple[str, bool] | None:
    """The newest complete save along `version`'s lineage, and whether it holds `version`'s own
    weights (its own, or a rollback's source's); None: no save on the lineage."""
    name: str | None = version
    same = True
    while name is not None and version_number(name) > 0:
        if is_complete(root / name):
            return name, same
        name, kept = parent(name)
        same = same and kept
    return None


def serving_weights(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The model's weights in bf16 on rank 0's CPU (None on the other ranks), a tied weight once.

    Under FSDP every rank calls it: each weight is cast on its shard and gathered (half of
    float32's traffic and of rank 0's host memory). A DDP rank holds the whole model: rank 0 casts."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    main = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # an LM head tied to the embeddings: `save_pretrained` writes it once
            continue
        seen.add(id(tensor))
        if not main and not isinstance(tensor, DTensor):
            continue  # a DDP rank's whole copy: rank 0's is written
        t = tensor.detach().to(torch.bfloat16)
        if isinstance(t, DTensor):
            t = t.full_tensor()  # a collective: every rank, in the same order
        if main:
            out[name] = t.cpu()
    return out if main else None


class Masters(nn.Module):
    """The float32 masters of a bf16 model (train/master.py) under the model's parameter names, so
    that DCP's state-dict helpers map AdamW's state to them."""

    def __init__(self, model: nn.Module, masters: list[nn.Parameter]) -> None:
        super().__init__()
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.weights = nn.ParameterDict({n.replace(".", ":"): m for n, m in zip(names, masters, strict=True)})


class ShardedSaves:
    """Every rank's side of the saves (module docstring); `every`: save each `every`-th version."""

    def __init__(
        self, run_dir: Path, trained: nn.Module, optimizer: torch.optim.Optimizer, every: int
    ) -> None:
        import torch.distributed as dist

        self.root = saves_dir(run_dir)
        self.trained = trained  # the model AdamW updates (or its masters)
        self.optimizer = optimizer
        self.every = every
        self.parent = parent_of(run_dir)
        self.main = dist.get_rank() == 0
        self.group = dist.new_group(backend="gloo")  # collective: every rank builds it, in step
        self.pending: Future | None = None

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, version: str) -> None:
        """Start writing `version`'s state (every rank); returns once this rank's state is copied."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        model, optim = get_state_dict(self.trained, self.optimizer)
        self.pending = dcp.async_save(
            {"model": model, "optim": optim}, checkpoint_id=self.root / version, process_group=self.group
        )

    def wait(self) -> None:
        """Until the save in flight is complete (then, on rank 0, prune old saves)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        pending.result()
        if self.main:
            self.prune()

    def restore(self, version: str) -> str | None:
        """Load the newest complete save on `version`'s lineage into the trained weights (when it is
        `version`'s own) and the optimizer (module docstring); returns its name, None without one."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        found = newest_save(self.root, version, self.parent)
        if found is None:
            return None
        name, own = found
        model, optim = get_state_dict(self.trained, self.optimizer)
        state: dict[str, Any] = {"model": model, "optim": optim} if own else {"optim": optim}
        dcp.load(state, checkpoint_id=self.root / name, no_dist=True)
        if own:
            set_model_state_dict(self.trained, state["model"])
        set_optimizer_state_dict(self.trained, self.optimizer, state["optim"])
        if not own and self.main:
            log.warning(
                "%s has no complete save of its own: its weights, AdamW's moments from %s", version, name
            )
        return name

    def prune(self) -> None:
        """Remove all but the newest `KEEP` complete saves, and incomplete ones older than those."""
        folders = sorted(
            (p for p in self.root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:])
        )
        complete = [p for p in folders if is_complete(p)]
        if not complete:
            return
        kept = complete[-KEEP:]
        for folder in folders:
            if folder not in kept and int(folder.name[1:]) < int(kept[-1].name[1:]):
                shutil.rmtree(folder, ignore_errors=True)


def sharded_saves(run_dir: Path, policy: Any, group: Any) -> ShardedSaves | None:
    """The saves of a group of ranks training full weights; None alone or with LoRA (a version
    folder holds the whole state as before: one process has it at hand, an adapter is small)."""
    cfg = policy.cfg
    if group.world <= 1 or cfg.weights != "full":
        return None
    master = policy.trainer.master
    trained = Masters(policy.model, master.params) if master is not None else policy.model
    return ShardedSaves(run_dir, trained, policy.optimizer, cfg.distributed.save_every)
