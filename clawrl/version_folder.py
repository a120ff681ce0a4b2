"""The version-folder format: what a published policy version is on disk (a shared contract).

    <run_dir>/checkpoints/vN/
        adapter_model.safetensors, adapter_config.json   the PEFT LoRA adapter (vLLM and
                                                         `PeftModel.from_pretrained` load it)
        or model*.safetensors, config.json               full fine-tuning: the whole model
                                                         (`save_pretrained`'s layout)
        optimizer.pt                                     the AdamW state dict
        manifest.json                                    {"version", "step", "samples", "metrics",
                                                          "created_at", "base_model", "parent"}
        pruned.json                                      once pruned: {"files": [...], "at", "why",
                                                         "bf16"}, what the trainer removed (below)

v0 is the base model and has no folder. The trainer writes a folder (`clawrl/train/checkpoints.py`:
atomically, under the publish lock, never over an existing one) and then the version's
row in the store; the engines read it (`clawrl/engine/local/merge.py` merges an adapter
into live weights, `clawrl/engine/vllm/` loads it as a LoRA adapter). A reader may rely
on: a `vN` folder with a `manifest.json` is complete (a crash leaves only hidden
`.vN-*.tmp` folders); an adapter is safetensors only (a pickled file is never read); the
LoRA math is

    W = W_base + scale * B @ A     A: [r, in], B: [out, r], scale = alpha / r (alpha / sqrt(r): rsLoRA)

Pruning (`clawrl/train/prune.py`, `train.keep_versions`, `train.keep_every`) removes files from a
published folder, never the folder: the trainer, under the publish lock, removes `optimizer.pt` past
the newest versions, and a version's weights (the adapter, or full `*.safetensors` and their index)
once it is neither served, newest, the newest held, a rollback's source nor a kept N-th; an adapter
kept for its weights alone is rewritten in bf16 (`"bf16"` in `pruned.json`). `pruned.json` names
what went and why, and is written before anything goes. A pruned folder keeps its manifest (and
its configs), so its row, history and records still name it. A reader loads a folder without
`optimizer.pt` with a fresh optimizer, and refuses a folder whose weights were pruned
(`weights_pruned`): export and rollback of one fail with an error naming the versions whose
weights are kept.

See docs/design.md, "The version folder".

Errors: `AdapterError` (a `ValueError`) for an adapter or weights file that cannot be read
or applied; nothing is changed when it is raised.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clawrl.types import DEFAULT_USER

if TYPE_CHECKING:  # torch and safetensors load with the first tensor read: naming versions stays cheap
    import torch
    from torch import nn

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
OPTIMIZER = "optimizer.pt"
PRUNED = "pruned.json"
# `vN` (the `default` user's line: a server without users, the admin key) or `<user>/vN` (a user's own
# line of versions with an adapter per user, `train.adapters`; its folder `checkpoints/<user>/vN/`).
VERSION_NAME = re.compile(r"^(?:(?P<user>[a-z0-9_-]{1,32})/)?v(?P<n>\d+)$")
_PLAIN = re.compile(r"^v\d+$")  # a version folder's own name
_USER_DIR = re.compile(r"^[a-z0-9_-]{1,32}$")  # a user's folder of versions (a `vN` name is no user's)
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# PEFT saves `base_model.model.<module>.lora_A.weight`; the adapter name
# (`lora_A.default.weight`) appears only in unsaved, in-memory state dicts.
_LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")

# adapter_config.json options that change the math above; we refuse rather than merge wrongly.
UNSUPPORTED = ("use_dora", "lora_bias", "fan_in_fan_out", "modules_to_save", "trainable_token_indices")

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")


def version_number(version: str) -> int:
    """`"v12"` -> 12, `"alice/v3"` -> 3; anything else is a ValueError."""
    match = VERSION_NAME.match(version)
    if match is None:
        raise ValueError(f"a version is named vN or <user>/vN, not {version!r}")
    return int(match["n"])


def version_user(version: str) -> str:
    """Whose line of versions `version` is on: `"alice/v3"` -> "alice", `"v3"` -> "default"."""
    match = VERSION_NAME.match(version)
    if match is None:
        raise ValueError(f"a version is named vN or <user>/vN, not {version!r}")
    return match["user"] or DEFAULT_USER


def version_name(user: str, number: int) -> str:
    """The name of `user`'s version N: `vN` for the default user (and for the base, v0, of every
    user: a user with no version yet is served the base), else `<user>/vN`."""
    return f"v{number}" if user == DEFAULT_USER or number == 0 else f"{user}/v{number}"


def version_rank(version: str) -> int:
    """`"v12"` -> 12, and -1 for anything that is not a version name (so it sorts first)."""
    match = VERSION_NAME.match(version)
    return int(match["n"]) if match else -1


def fingerprint_of(version: str) -> str:
    """The `system_fingerprint` of an answer made by `version`: "clawrl-v3", "clawrl-alice-v3"."""
    return f"clawrl-{version.replace('/', '-')}"


def fingerprint_version(fingerprint: str | None) -> str:
    """The policy version in a clawrl `system_fingerprint` ("clawrl-v3" -> "v3", "clawrl-alice-v1" ->
    "alice/v1"); "" if none."""
    if not fingerprint or "-" not in fingerprint:
        return ""
    rest = fingerprint.removeprefix("clawrl-")
    user, _, number = rest.rpartition("-")
    return f"{user}/{number}" if user else number


def version_dir(run_dir: Path, version: str) -> Path:
    """Where `version` lives (or would live) in `run_dir`: `checkpoints/vN`, `checkpoints/<user>/vN`."""
    version_number(version)
    return Path(run_dir) / CHECKPOINTS / version


def is_adapter(folder: Path) -> bool:
    """True for a LoRA version (an adapter folder), False for full weights."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def read_manifest(folder: Path) -> dict:
    return json.loads((Path(folder) / MANIFEST).read_text())


def pruned_marker(folder: Path) -> dict:
    """A version folder's `pruned.json`: {"files": removed, "at", "why", "bf16": files cast to bf16};
    {} for one never pruned."""
    marker = Path(folder) / PRUNED
    return dict(json.loads(marker.read_text())) if marker.is_file() else {}


def pruned_files(folder: Path) -> list[str]:
    """The files pruning removed from a version folder (`pruned.json`); [] for one never pruned."""
    return list(pruned_marker(folder).get("files", []))


def weights_pruned(folder: Path) -> bool:
    """True for a version whose weights (full or adapter) were pruned: it cannot be loaded any more."""
    return any(name != OPTIMIZER for name in pruned_files(folder))


def full_weight_files(folder: Path) -> list[Path]:
    """A full version's model weights: its `*.safetensors` shards and their index (never an adapter)."""
    return sorted(
        p
        for p in Path(folder).iterdir()
        if (p.suffix == ".safetensors" and p.name != ADAPTER_WEIGHTS)
        or p.name.endswith(".safetensors.index.json")
    )


def folder_bytes(run_dir: Path) -> dict[str, int]:
    """Bytes of each complete version's folder, v1 first (what `/healthz` shows under `disk`)."""
    folders = [(f.name, f) for f in complete_versions(run_dir)]
    folders += [(f"{user}/{f.name}", f) for user, found in user_versions(run_dir).items() for f in found]
    return {name: sum(_size(p) for p in f.iterdir()) for name, f in folders}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:  # pruned by the trainer while the server counts
        return 0


def complete_versions(run_dir: Path) -> list[Path]:
    """The folders of every complete version (a manifest written) of the default user, v1 first."""
    return _complete_in(Path(run_dir) / CHECKPOINTS)


def user_versions(run_dir: Path) -> dict[str, list[Path]]:
    """Each user's complete version folders (`checkpoints/<user>/vN`), v1 first, by user name."""
    users = _user_dirs(Path(run_dir) / CHECKPOINTS)
    return {user: found for user, p in users.items() if (found := _complete_in(p))}


def version_folders(run_dir: Path) -> dict[str, Path]:
    """Every version folder, complete or not, by the version's name (`v3`, `alice/v3`)."""
    root = Path(run_dir) / CHECKPOINTS
    found = {p.name: p for p in root.iterdir() if _PLAIN.match(p.name)} if root.is_dir() else {}
    for user, folder in _user_dirs(root).items():
        found |= {f"{user}/{p.name}": p for p in folder.iterdir() if _PLAIN.match(p.name)}
    return {name: p for name, p in found.items() if p.is_dir()}


def is_user_dir_name(name: str) -> bool:
    """Whether `name` can be a user's folder of versions under checkpoints/ (never a `vN` name)."""
    return bool(_USER_DIR.fullmatch(name)) and not _PLAIN.fullmatch(name)


def _user_dirs(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and is_user_dir_name(p.name)}


def _complete_in(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if _PLAIN.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(folders, key=lambda p: version_number(p.name))


class AdapterError(ValueError):
    """An adapter folder that cannot be merged into the serving model."""


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a truncated or garbled file is an AdapterError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except SafetensorError as exc:  # not an OSError or ValueError: callers would miss it
        raise AdapterError(f"{path} is not a readable safetensors file: {exc}") from exc


@dataclass(frozen=True)
class LoraDelta:
    """One adapted linear layer: W = W_base + scale * b @ a."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


def read_adapter(adapter_dir: Path) -> dict[str, LoraDelta]:
    """Read a PEFT LoRA folder (as `PeftModel.save_pretrained` writes it): module name -> delta."""
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{adapter_dir} holds a {config.get('peft_type')} adapter, not LORA")
    if used := [k for k in UNSUPPORTED if config.get(k)]:
        raise AdapterError(f"{adapter_dir}: merging adapters with {', '.join(used)} is not supported")
    if not (adapter_dir / ADAPTER_WEIGHTS).is_file() and weights_pruned(adapter_dir):
        raise AdapterError(f"{adapter_dir} holds no adapter weights (pruned: train.keep_versions)")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in read_tensors(adapter_dir / ADAPTER_WEIGHTS).items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise AdapterError(f"{adapter_dir}: unexpected tensor {key} (only linear LoRA A/B weights merge)")
        pairs.setdefault(match["module"], {})[match["ab"]] = tensor
    return {module: _delta(adapter_dir, module, ab, config) for module, ab in pairs.items()}


def _delta(adapter_dir: Path, module: str, ab: dict[str, torch.Tensor], config: dict) -> LoraDelta:
    if ab.keys() != {"A", "B"} or ab["B"].shape[1] != ab["A"].shape[0]:
        shapes = {k: tuple(v.shape) for k, v in ab.items()}
        raise AdapterError(f"{adapter_dir}: {module} needs matching lora_A and lora_B, found {shapes}")
    rank = ab["A"].shape[0]  # the saved shape is the truth, whatever rank_pattern says
    alpha = config["lora_alpha"]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):  # PEFT's own rule (peft.utils.other.get_pattern_key)
            alpha = value
            break
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraDelta(a=ab["A"], b=ab["B"], scale=scale)


def read_full_weights(folder: Path) -> dict[str, torch.Tensor]:
    """A full version's state dict, read from its `*.safetensors` files (one or several shards)."""
    files = sorted(p for p in Path(folder).glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        pruned = " (pruned: train.keep_versions)" if weights_pruned(folder) else ""
        raise AdapterError(f"{folder} holds no model weights (*.safetensors){pruned}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(read_tensors(path))
    return state


def is_weights(name: str) -> bool:
    return name.endswith(WEIGHT_FILES) or name.endswith(".index.json")


def latest_version(run_dir: Path) -> str | None:
    """The complete version with the highest N, or None when only v0 (the base model) exists."""
    versions = complete_versions(run_dir)
    return versions[-1].name if versions else None


def list_versions(run_dir: Path) -> list[dict]:
    """The manifests of every complete version, v1 first."""
    return [read_manifest(folder) for folder in complete_versions(run_dir)]


def check_names(names: Collection[str], own: Mapping[str, torch.Tensor]) -> None:
    """`AdapterError` unless `names` are the model's weights (`own`, its state dict): none it lacks,
    none left out but tied copies of a named one (one parameter under two names)."""
    if unexpected := sorted(set(names) - own.keys()):
        raise AdapterError(f"the weights name tensors this model does not have: {unexpected[:5]}")
    given = {id(own[k]) for k in names}
    if missing := sorted(k for k in own.keys() - set(names) if id(own[k]) not in given):
        raise AdapterError(f"the weights leave out {missing[:5]}")


def load_full_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into `model`'s weights in place (cast to their dtype and device); no grad needed.

    Every weight must be given, except tied copies of a given one (an LM head tied
    to the embeddings, which `save_pretrained` stores once). Checked first: on an
    `AdapterError` nothing has changed.
    """
    own = model.state_dict(keep_vars=True)
    check_names(state.keys(), own)
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise AdapterError(
                f"{key}: the weights are {tuple(tensor.shape)}, the model {tuple(own[key].shape)}"
            )
    for key, tensor in state.items():
        own[key].data.copy_(local_part(tensor, own[key]))  # a sharded model's rank: its shard


def is_sharded(t: torch.Tensor) -> bool:
    """Whether `t` is one rank's shard of a tensor over several (a DTensor: FSDP, `train/shards.py`)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_part(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` as `like` holds it: itself, or, when `like` is sharded, this rank's shard of it (cut
    here, with no communication: every rank of an FSDP trainer loads a version on its own).

    The shard is cut where `whole` lies (a CPU tensor, perhaps mapped from a file) and only the
    shard is copied to `like`'s device and dtype: never a whole tensor on a rank's GPU."""
    if not is_sharded(like):
        return whole
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    size, offset = compute_local_shape_and_global_offset(like.shape, like.device_mesh, like.placements)
    part = whole[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))]
    part = part.to(device=like.device, dtype=like.dtype, copy=True).contiguous()  # its own memory
    return DTensor.from_local(
        part, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    )
