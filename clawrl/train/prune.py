"""Pruning version folders: what a long run keeps on disk (`train.keep_versions` K, `train.keep_every` N).

Every version writes its weights and AdamW's state (`checkpoints.py`): a 4B LoRA run ~0.4 GB a
version (a 132 MB float32 adapter, twice that in optimizer state); 8B full fine-tuning ~100 GB.
Right after it publishes a version, still under the publish lock (so no rollback, no other publisher
and no reader naming a version by its row races it), the trainer prunes one line of versions (the
default user's, or with an adapter per user the publishing user's own):

- the optimizer state (`optimizer.pt`) of every version except the newest K and the served one:
  the trainer resumes from the served version (the newest one the canary gate did not hold), so
  its state is always kept;
- the weights (a LoRA adapter or full `*.safetensors`) of every version except the served one, the
  newest K, the newest held version (held by the canary gate: kept to look at until another hold
  replaces it), a version this trainer could not load, a version a user pinned by rolling back to
  it (`rollback_of`), and every N-th version (vN with N | n: a sparse history to roll back to).
  v0, the base model, has no folder and is never touched;
- an adapter kept for its weights alone (its optimizer state gone) is stored in bf16: what serving
  reads is unchanged within the tolerance tests/unit/test_prune.py states, at half the bytes. The
  newest K and the served one stay in float32, so the trainer resumes from exactly what it saved.

A folder is never deleted: it keeps its manifest, so the store's row, `clawrl versions` and the
records still name it; `pruned.json` in it names what went and why (`clawrl/version_folder.py`).

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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clawrl.types import Version
from clawrl.version_folder import (
    ADAPTER_WEIGHTS,
    CHECKPOINTS,
    OPTIMIZER,
    PRUNED,
    full_weight_files,
    pruned_marker,
    version_dir,
    version_number,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pruning:
    """What to do: the versions whose optimizer state goes, those whose weights go, the adapters
    cast to bf16, and why (a version's reason, as `pruned.json` and `clawrl versions` show it)."""

    optimizer: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()
    halve: tuple[str, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict, compare=False)


def choose(
    versions: Sequence[Version],
    served: Collection[str],
    keep: int,
    full: bool,
    inspect: Collection[str] = (),
    every: int = 0,
) -> Pruning:
    """What pruning does to one line of versions (held ones and rollbacks' sources included).

    `served`: the versions the server serves or may serve; `keep`: K, the newest versions kept whole;
    `full`: the run trains full weights (else LoRA adapters, cast to bf16 once only their weights
    are kept); `inspect`: versions held for inspection (ones the trainer could not load); `every`:
    N, every vN with n a multiple of N keeps its weights (0: none).
    """
    if keep < 1:
        raise ValueError(f"train.keep_versions must be > 0, got {keep}")
    if every < 0:
        raise ValueError(f"train.keep_every must be >= 0, got {every}")
    folders = sorted((v for v in versions if v.path is not None), key=lambda v: v.number)
    kept = {v.name for v in folders[-keep:]} | set(served)
    optimizer = tuple(v.name for v in folders if v.name not in kept)
    held = [v.name for v in folders if v.held]
    pinned = kept | set(inspect) | set(held[-1:])
    pinned |= {str(v.metrics["rollback_of"]) for v in versions if v.metrics.get("rollback_of")}
    pinned |= {v.name for v in folders if every and v.number % every == 0}
    weights = tuple(v.name for v in folders if v.name not in pinned)
    halve = () if full else tuple(n for n in optimizer if n not in weights)
    why = {n: _why(keep, every, weights=n in weights) for n in optimizer}
    return Pruning(optimizer, weights, halve, why)


def _why(keep: int, every: int, weights: bool) -> str:
    """Why a version lost what it lost, in the words `clawrl versions` prints."""
    newest = f"not among the newest {keep} (train.keep_versions)"
    if not weights:
        return f"optimizer state: {newest} nor served"
    nth = f", not a multiple of {every} (train.keep_every)" if every else ""
    return f"weights and optimizer state: {newest}, not served, held last nor rolled back to{nth}"


def prune(run_dir: Path, pruning: Pruning) -> int:
    """Do what `pruning` says to the version folders (what is done already is skipped); returns
    the bytes freed. `pruned.json` is written before any file goes, so a crash in between leaves a
    folder that says so; the next pruning removes the rest."""
    freed = 0
    names = {*pruning.optimizer, *pruning.weights, *pruning.halve}
    for name in sorted(names, key=version_number):
        folder = version_dir(run_dir, name)
        files = [folder / OPTIMIZER] if name in pruning.optimizer else []
        if name in pruning.weights:
            files += [*full_weight_files(folder), folder / ADAPTER_WEIGHTS]
        files = [f for f in files if f.is_file()]
        halve = name in pruning.halve and _float32(folder / ADAPTER_WEIGHTS)
        if not files and not halve:
            continue
        _mark(
            run_dir=run_dir,
            folder=folder,
            names=[f.name for f in files],
            why=pruning.why.get(name, ""),
            halved=halve,
        )
        for f in files:
            freed += f.stat().st_size
            f.unlink()
        if halve:
            freed += _to_bf16(run_dir, folder / ADAPTER_WEIGHTS)
        log.info("pruned %s: %s%s", name, ", ".join(f.name for f in files), " (adapter in bf16)" * halve)
    return freed


def _float32(path: Path) -> bool:
    """Whether the adapter file holds a float32 tensor (so casting it to bf16 frees bytes)."""
    from safetensors import safe_open

    if not path.is_file():
        return False
    with safe_open(path, framework="pt") as f:
        return any(f.get_slice(k).get_dtype() == "F32" for k in f.keys())  # noqa: SIM118 (a safe_open handle, not a dict)


def _to_bf16(run_dir: Path, path: Path) -> int:
    """Rewrite the adapter's float tensors in bf16, atomically (aside in `checkpoints/`); bytes freed."""
    import torch
    from safetensors.torch import load_file, save_file

    before = path.stat().st_size
    tensors = {k: t.to(torch.bfloat16) if t.is_floating_point() else t for k, t in load_file(path).items()}
    tmp = Path(run_dir) / CHECKPOINTS / f".{path.parent.name}-bf16-{time.time_ns()}.tmp"
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)
    return before - path.stat().st_size


def _mark(run_dir: Path, folder: Path, names: list[str], why: str, halved: bool) -> None:
    """Add `names` (and why) to the folder's `pruned.json`, atomically (written aside, hidden)."""
    marker = pruned_marker(folder)
    files = sorted({*marker.get("files", []), *names})
    record = {"files": files, "at": time.time(), "why": why or marker.get("why", "")}
    if halved or marker.get("bf16"):
        record["bf16"] = [ADAPTER_WEIGHTS]
    tmp = Path(run_dir) / CHECKPOINTS / f".{folder.name}-pruned-{time.time_ns()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / PRUNED)
