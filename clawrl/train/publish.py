"""Versions a user publishes or exports by hand: `clawrl rollback` and `clawrl export --merged`.

A rollback never rewrites history: it publishes a *new* version (the next
vN) whose folder is a copy of the chosen one, weights and optimizer state,
with `rollback_of` in its manifest and metrics. The server swaps it in as any
version; the trainer, seeing a version it did not publish, loads it and goes
on training from there. Going back to v0 publishes the base model again: no
folder with LoRA (the adapter off), a copy of the base weights with full
fine-tuning (so the server needs no copy of the base in memory).

A full-weight version whose weights were pruned (`train.keep_versions`, `train/prune.py`) can be
neither rolled back to nor exported: both fail with an error naming the versions whose weights
are kept. Both hold the publish lock while they read the version, so the trainer, which prunes
under it, waits for them. A version whose optimizer state was pruned rolls back with a fresh
optimizer.

With an adapter per user (`train.adapters`, docs/users.md) each user's versions are rolled back and
exported alone: `clawrl rollback alice/v2` publishes alice's next version as a copy of `alice/v2`
(`alice/v0`, or `v0`, given for alice: her base), and no other user's line changes.
"""

from __future__ import annotations

from pathlib import Path

from clawrl.config import Config
from clawrl.model.load import model_folder, served_context
from clawrl.store.db import Store
from clawrl.train.checkpoints import claim_next, copy_version, publish_lock
from clawrl.train.weights import export_merged
from clawrl.types import Version
from clawrl.version_folder import MANIFEST, PRUNED, version_number, version_user, weights_pruned


def find_version(store: Store, name: str | None) -> Version:
    """The named version (None: the latest); ValueError naming the known ones if it does not exist.
    `alice/v0` is the base as alice's line starts from it (the v0 row)."""
    if name is None:
        return store.latest_version()
    version_number(name)
    if version_number(name) == 0:
        return store.versions()[0]
    known = {v.name: v for v in store.versions(None)}
    if name not in known:
        raise ValueError(f"no version {name} in this run (there are {', '.join(known)})")
    return known[name]


def rollback(store: Store, config: Config, target: str, user: str | None = None) -> Version:
    """Publish the next version of `user` (by default: the one `target` is named for) as a copy of
    `target`; returns it."""
    user = user or version_user(target)
    with publish_lock(config.run_dir):  # taken first: pruning, under it too, cannot race the copy
        source = require_weights(store, find_version(store, target))
        name = claim_next(config.run_dir, store.latest_version(user).number, user)
        manifest = {
            "step": source.step,
            "samples": [],
            "metrics": {},
            "parent": target,
            "rollback_of": target,
        }
        files = _files_of(source, config)
        folder = None if files is None else copy_version(config.run_dir, name, files, manifest)
        version = Version(
            name=name,
            step=source.step,
            path=str(folder) if folder else None,
            metrics={"rollback_of": target, "samples": 0},
            parent=target,
        )
        store.publish_version(version, trained=[])
    return version


def _files_of(source: Version, config: Config) -> list[Path] | None:
    if source.path is not None:
        return [p for p in Path(source.path).iterdir() if p.is_file() and p.name not in (MANIFEST, PRUNED)]
    if config.train.weights == "lora":
        return None  # v0 with LoRA: the adapter off
    base = model_folder(config.model.path, config.cache_dir())
    return [p for p in base.iterdir() if p.suffix == ".safetensors" or p.name == "config.json"]


def export(store: Store, config: Config, name: str | None, out: Path) -> Path:
    """Write version `name` (default: the latest) as a standalone Hugging Face model folder."""
    base = model_folder(config.model.path, config.cache_dir())
    m = config.model
    context = served_context(m.path, m.max_context)
    with publish_lock(config.run_dir):  # the trainer prunes under it: not this version while it is read
        version = require_weights(store, find_version(store, name))
        folder = Path(version.path) if version.path else None
        return export_merged(
            base_dir=base, version_dir=folder, out_dir=out, max_context=context, rope_scaling=m.rope_scaling
        )


def require_weights(store: Store, version: Version) -> Version:
    """`version`, unless its full weights were pruned: then a ValueError naming those that are kept."""
    if version.path is None or not weights_pruned(Path(version.path)):
        return version
    kept = [
        v.name for v in store.versions(version.user) if v.path is None or not weights_pruned(Path(v.path))
    ]
    raise ValueError(
        f"the weights of {version.name} were pruned (train.keep_versions); "
        f"versions whose weights are kept: {', '.join(kept)}"
    )
