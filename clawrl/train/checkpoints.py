"""Versions on disk: one folder per published policy, written atomically.

    <run_dir>/checkpoints/vN/
        adapter_model.safetensors, adapter_config.json   the PEFT LoRA adapter (vLLM and
                                                         `PeftModel.from_pretrained` load it)
        optimizer.pt                                     the AdamW state dict
        manifest.json                                    {"version", "step", "samples", "metrics",
                                                          "created_at", "base_model", "parent"}

v0 is the base model and has no folder. A version is written into a hidden
temporary folder inside `checkpoints/` and renamed to `vN` only once every file
is on disk, so a crash never leaves a `vN` that looks complete; a leftover
`.vN-*.tmp` folder is ignored. Versions are never overwritten.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from clawrl.train.weights import ADAPTER_WEIGHTS

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
OPTIMIZER = "optimizer.pt"
_VERSION = re.compile(r"^v(\d+)$")


def version_number(version: str) -> int:
    """`"v12"` -> 12; anything else is a ValueError."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"a version is named vN, not {version!r}")
    return int(match[1])


def version_dir(run_dir: Path, version: str) -> Path:
    """Where `version` lives (or would live) in `run_dir`."""
    version_number(version)
    return Path(run_dir) / CHECKPOINTS / version


def save_version(
    run_dir: Path, version: str, peft_model: PeftModel, optimizer: torch.optim.Optimizer, manifest: dict
) -> Path:
    """Write `version` (v1, v2, ...) and return its folder; refuses to overwrite an existing one.

    `manifest` holds at least `step`, `samples` and `metrics`; `version`,
    `created_at` (Unix seconds), `base_model` and `parent` (v{N-1}) are filled
    in when absent.
    """
    number = version_number(version)
    if number < 1:
        raise ValueError("v0 is the base model; saved versions start at v1")
    final = version_dir(run_dir, version)
    if final.exists():
        raise FileExistsError(f"{final} exists; versions are never overwritten")
    manifest = _complete(manifest, version, number, peft_model)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", suffix=".tmp", dir=final.parent))
    try:
        peft_model.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _fsync_folder(tmp)
        if final.exists():  # rename() would silently replace an empty folder
            raise FileExistsError(f"{final} appeared while saving; versions are never overwritten")
        tmp.rename(final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_version(
    run_dir: Path, version: str, peft_model: PeftModel, optimizer: torch.optim.Optimizer | None = None
) -> dict:
    """Load `version`'s adapter weights (and optimizer state) into the given objects; return its manifest.

    `peft_model` must have the same LoRA shape as the one saved, and
    `optimizer` must be built over its trainable parameters in the same order.
    """
    folder = version_dir(run_dir, version)
    if not (folder / MANIFEST).is_file():
        raise FileNotFoundError(f"no complete version {version} in {folder.parent}")
    result = set_peft_model_state_dict(peft_model, load_file(folder / ADAPTER_WEIGHTS))
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{folder} does not fit this model: "
            f"unexpected {result.unexpected_keys[:3]}, missing {missing[:3]}"
        )
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True))
    return _read_manifest(folder)


def latest_version(run_dir: Path) -> str | None:
    """The complete version with the highest N, or None when only v0 (the base model) exists."""
    versions = _complete_versions(run_dir)
    return versions[-1].name if versions else None


def list_versions(run_dir: Path) -> list[dict]:
    """The manifests of every complete version, v1 first."""
    return [_read_manifest(folder) for folder in _complete_versions(run_dir)]


def _complete_versions(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if _VERSION.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(folders, key=lambda p: version_number(p.name))


def _complete(manifest: dict, version: str, number: int, peft_model: PeftModel) -> dict[str, Any]:
    if manifest.get("version", version) != version:
        raise ValueError(f"manifest says {manifest['version']!r}, saving {version!r}")
    return {
        "version": version,
        "created_at": time.time(),
        "base_model": peft_model.active_peft_config.base_model_name_or_path,
        "parent": f"v{number - 1}",
        **manifest,
    }


def _read_manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


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
