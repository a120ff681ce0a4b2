"""Pruning version folders: what a long run keeps on disk (`train.keep_versions`, K).

Every version writes its weights and AdamW's state (`checkpoints.py`): a 4B LoRA run ~0.4 GB a
version, mostly optimizer state; 8B full fine-tuning ~100 GB. Right after it publishes a version,
still under the publish lock (so no rollback, no other publisher and no reader naming a version by
its row races it), the trainer prunes:

- the optimizer state (`optimizer.pt`) of every version except the newest K and the served one:
  the trainer resumes from the served version (the newest one the canary gate did not hold), so
  its state is always kept;
- the model weights (`*.safetensors`) of a full-weight version, except the served one, the newest K,
  a version held for inspection (held by the canary gate, or one this trainer could not load: its
  folder stays to look at) and a version named by a rollback (`rollback_of`). v0, the base model,
  has no folder and is never touched.

A LoRA adapter is never pruned (megabytes), so every LoRA version stays servable and exportable.
A folder is never deleted: it keeps its manifest, so the store's row, `clawrl versions` and the
records still name it; `pruned.json` in it names what went (`clawrl/version_folder.py`).

"Served" is what the trainer can know of the server: the newest version not held (what the
server's watcher serves, or is about to) and the version of the newest recorded turn (what the
server answered with last, in case it could not load the newer one).

`choose` is the pure choice; `prune` applies it to the folders.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from clawrl.types import Version
from clawrl.version_folder import (
    CHECKPOINTS,
    OPTIMIZER,
    PRUNED,
    full_weight_files,
    pruned_files,
    version_dir,
    version_number,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pruning:
    """What to remove: the versions whose optimizer state goes, and those whose full weights go."""

    optimizer: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()


def choose(
    versions: Sequence[Version],
    served: Collection[str],
    keep: int,
    full: bool,
    inspect: Collection[str] = (),
) -> Pruning:
    """What pruning removes, from the store's versions (held ones and rollbacks' sources included).

    `served`: the versions the server serves or may serve; `keep`: K, the newest versions kept whole;
    `full`: the run trains full weights (else a LoRA adapter, whose weights always stay);
    `inspect`: more versions held for inspection (ones the trainer could not load).
    """
    if keep < 1:
        raise ValueError(f"train.keep_versions must be > 0, got {keep}")
    folders = sorted((v for v in versions if v.path is not None), key=lambda v: v.number)
    kept = {v.name for v in folders[-keep:]} | set(served)
    optimizer = tuple(v.name for v in folders if v.name not in kept)
    if not full:
        return Pruning(optimizer)
    named = {str(v.metrics["rollback_of"]) for v in versions if v.metrics.get("rollback_of")}
    pinned = kept | named | set(inspect) | {v.name for v in folders if v.held}
    return Pruning(optimizer, tuple(v.name for v in folders if v.name not in pinned))


def prune(run_dir: Path, pruning: Pruning) -> int:
    """Remove what `pruning` names from the version folders (what is gone already is skipped);
    returns the bytes freed. `pruned.json` is written before any file goes, so a crash in between
    leaves a folder that says so; the next pruning removes the rest."""
    freed = 0
    for name in sorted({*pruning.optimizer, *pruning.weights}, key=version_number):
        folder = version_dir(run_dir, name)
        files = [folder / OPTIMIZER] if name in pruning.optimizer else []
        files += full_weight_files(folder) if name in pruning.weights else []
        files = [f for f in files if f.is_file()]
        if not files:
            continue
        _mark(run_dir, folder, [f.name for f in files])
        for f in files:
            freed += f.stat().st_size
            f.unlink()
        log.info("pruned %s: %s", name, ", ".join(f.name for f in files))
    return freed


def _mark(run_dir: Path, folder: Path, names: list[str]) -> None:
    """Add `names` to the folder's `pruned.json`, atomically (written aside in `checkpoints/`, hidden)."""
    files = sorted({*pruned_files(folder), *names})
    tmp = Path(run_dir) / CHECKPOINTS / f".{folder.name}-pruned-{time.time_ns()}.tmp"
    tmp.write_text(json.dumps({"files": files, "at": time.time()}))
    os.replace(tmp, folder / PRUNED)
