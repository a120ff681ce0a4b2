"""Writing versions: one folder per published policy, written atomically, never overwritten.

What a folder holds, and what a reader may rely on, is the version-folder format
(`clawrl/version_folder.py`). A version is written into a hidden temporary folder inside
`checkpoints/` (`checkpoints/<user>/` for a user's own line, docs/users.md) and renamed to `vN` only
once every file is on disk, so a crash never leaves a `vN` that looks complete; a leftover
`.vN-*.tmp` folder is ignored. Names are claimed, and folders and store rows written, under the
publish lock (`publish_lock`). Loading a version into the trainer's model (`load_version`,
`load_folder`) is here too. Pruning (`train/prune.py`) later removes files from old folders, never a
folder or its manifest.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, set_peft_model_state_dict

from clawrl.train.meta_load import fill_shards
from clawrl.train.shards import copy_whole, local_optimizer_state
from clawrl.types import DEFAULT_USER
from clawrl.version_folder import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CHECKPOINTS,
    MANIFEST,
    OPTIMIZER,
    is_sharded,
    load_full_weights,
    read_full_weights,
    read_manifest,
    read_tensors,
    version_dir,
    version_name,
    version_number,
    version_user,
)

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A version folder that cannot be loaded: a file missing, truncated or garbled, or another shape."""


@contextmanager
def publish_lock(run_dir: Path) -> Iterator[None]:
    """Held while a version's folder and store row are written (by the trainer or a rollback).

    An exclusive `flock` on `checkpoints/.publish.lock`: whoever holds it picks the
    next name and publishes it, so two publishers never race for a name and a
    folder without a row under the lock can only be a crash's leftover.
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".publish.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_version(
    run_dir: Path,
    version: str,
    model: Any,
    optimizer: torch.optim.Optimizer,
    manifest: dict,
    state: tuple[dict, dict] | None = None,
) -> Path:
    """Write `version` (v1, v2, ...) and return its folder; refuses to overwrite an existing one.

    `manifest` holds at least `step`, `samples` and `metrics`; `version`,
    `created_at` (Unix seconds), `base_model` and `parent` (v{N-1}) are filled
    in when absent. `state`: the whole (model, optimizer) state when the objects hold shards
    (`train/shards.py`), its optimizer state None where the group saves it apart (train/saves.py: no
    `optimizer.pt`); None: theirs.
    """
    number = version_number(version)
    if number < 1:
        raise ValueError("v0 is the base model; saved versions start at v1")
    manifest = _complete(manifest, version, number, model)
    weights, optim = state if state is not None else (None, optimizer.state_dict())

    def fill(tmp: Path) -> None:
        # A PeftModel writes its adapter; a plain model, all of itself.
        model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
        if optim is not None:
            torch.save(optim, tmp / OPTIMIZER)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))

    return _write_atomically(version_dir(run_dir, version), fill)


def copy_version(run_dir: Path, version: str, files: list[Path], manifest: dict) -> Path:
    """Write `version` from existing files (a rollback: an earlier version's, or the base model's).

    Like `save_version`, atomically and never over an existing folder. `manifest`
    is written as given, with `version` and `created_at` set.
    """

    def fill(tmp: Path) -> None:
        for path in files:
            shutil.copy2(path, tmp / path.name)
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "version": version, "created_at": time.time()}))

    return _write_atomically(version_dir(run_dir, version), fill)


def write_folder(run_dir: Path, version: str, fill: Callable[[Path], None]) -> Path:
    """Write `version`'s folder with `fill` (the files a remote trainer uploaded: train/remote/), as
    `save_version` writes one: atomically, never over an existing folder."""
    return _write_atomically(version_dir(run_dir, version), fill)


def _write_atomically(final: Path, fill: Callable[[Path], None]) -> Path:
    """Let `fill` write a hidden temporary folder, then rename it to `final` (never over one)."""
    if final.exists():
        raise FileExistsError(f"{final} exists; versions are never overwritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", suffix=".tmp", dir=final.parent))
    try:
        fill(tmp)
        _fsync_folder(tmp)
        if final.exists():  # rename() would silently replace an empty folder
            raise FileExistsError(f"{final} appeared while saving; versions are never overwritten")
        tmp.rename(final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def set_aside(folder: Path, why: str) -> Path:
    """Rename a version folder that must not be used (never deleted) to `.vN-<why>-<ns>`; returns it."""
    target = folder.with_name(f".{folder.name}-{why}-{time.time_ns()}")
    folder.rename(target)
    log.warning("moved %s aside to %s (%s)", folder, target, why)
    return target


def claim_next(run_dir: Path, latest: int, user: str = DEFAULT_USER) -> str:
    """Under `publish_lock`: the name after `user`'s v`latest` (`v4`, `alice/v4`), its folder cleared
    of a crash's leftover.

    Publishers finish folder and row before releasing the lock, so a folder that
    exists without a row here was left by one that died in between.
    """
    name = version_name(user, latest + 1)
    if version_dir(run_dir, name).exists():
        set_aside(version_dir(run_dir, name), "unpublished")
    return name


def load_version(
    run_dir: Path, version: str, model: Any, optimizer: torch.optim.Optimizer | None = None
) -> dict:
    """Load `version`'s weights (and optimizer state) into the given objects; return its manifest.

    `model` is the trainer's: a `PeftModel` with the same LoRA shape as the one
    saved, or the plain model a full version was trained from. `optimizer` must
    be built over its trainable parameters in the same order.
    """
    return load_folder(version_dir(run_dir, version), model, optimizer)


def load_folder(folder: Path, model: Any, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """`load_version` for a version folder given by path (a version row's `path`).

    Raises CheckpointError, naming the folder, when it cannot be loaded; the
    model may then hold part of it, so load another version before using it.
    """
    folder = Path(folder)
    try:
        return _load_folder(folder, model, optimizer)
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: torch.load of a torn optimizer.pt
        raise CheckpointError(f"cannot load the version in {folder}: {exc}") from exc


def _load_folder(folder: Path, model: Any, optimizer: torch.optim.Optimizer | None) -> dict:
    if not (folder / MANIFEST).is_file():
        raise FileNotFoundError(f"no complete version in {folder}")
    if (folder / ADAPTER_CONFIG).is_file():
        _load_adapter(folder, model)
    else:
        _load_full(folder, model)
    if optimizer is not None and (folder / OPTIMIZER).is_file():  # a rollback to the base has none
        # Sharded, the file is mapped, not read: each rank copies only its shards out of it.
        mapped = any(is_sharded(p) for group in optimizer.param_groups for p in group["params"])
        saved = torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True, mmap=mapped)
        optimizer.load_state_dict(local_optimizer_state(saved, optimizer))
    return read_manifest(folder)


def _load_adapter(folder: Path, model: Any) -> None:
    if not isinstance(model, PeftModel):
        raise ValueError(f"{folder} holds a LoRA adapter; this trainer trains full weights (train.weights)")
    tensors = read_tensors(folder / ADAPTER_WEIGHTS)
    if any(is_sharded(p) for p in model.parameters()):
        unexpected, missing = _load_adapter_shards(model, tensors)
    else:
        result = set_peft_model_state_dict(model, tensors)
        unexpected, missing = result.unexpected_keys, [k for k in result.missing_keys if ".lora_" in k]
    if unexpected or missing:
        raise ValueError(
            f"{folder} does not fit this model: unexpected {unexpected[:3]}, missing {missing[:3]}"
        )


def _load_adapter_shards(model: Any, tensors: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """An adapter file into a sharded PeftModel, each rank its shards: (unexpected, missing) keys.

    The file names a parameter as PEFT's `save_pretrained` does: without the adapter's name."""
    name = model.active_adapter
    own = {k.replace(f".{name}.", "."): p for k, p in model.named_parameters() if ".lora_" in k}
    unexpected, missing = sorted(tensors.keys() - own.keys()), sorted(own.keys() - tensors.keys())
    if not unexpected and not missing:
        for key, tensor in tensors.items():
            copy_whole(own[key], tensor)
    return unexpected, missing


def _load_full(folder: Path, model: Any) -> None:
    if isinstance(model, PeftModel):
        raise ValueError(f"{folder} holds full weights; this trainer trains a LoRA adapter (train.weights)")
    if any(is_sharded(p) for p in model.parameters()):
        fill_shards(folder, model)  # each rank reads its slices, never the whole state (train/meta_load.py)
        return
    with torch.no_grad():
        load_full_weights(model, read_full_weights(folder))


def _complete(manifest: dict, version: str, number: int, model: Any) -> dict[str, Any]:
    if manifest.get("version", version) != version:
        raise ValueError(f"manifest says {manifest['version']!r}, saving {version!r}")
    return {
        "version": version,
        "created_at": time.time(),
        "base_model": _base_name(model),
        "parent": version_name(version_user(version), number - 1),
        **manifest,
    }


def _base_name(model: Any) -> str | None:
    if isinstance(model, PeftModel):
        return model.active_peft_config.base_model_name_or_path
    return getattr(model.config, "name_or_path", None)


def _fsync_folder(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            _fsync(path)
    _fsync(folder)


def _fsync(path: Path) -> None:
    # Flush to disk before the rename publishes the folder; a directory is fsynced to keep its entries.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
