"""The facts the memory budget is planned on, and the calls that keep a process to its share.

Facts: which GPU a device name means (`cuda_index`), every visible GPU's total memory
(`gpu_totals`), and the model folder's shape and parameter count (`model_facts`: config.json
and the safetensors headers, no weights read). The arithmetic on them is `budget.py`'s.

Keeping to a share: `cap_process` makes the process's GPU its current device and caps its
caching allocator (`torch.cuda.set_per_process_memory_fraction`: an allocation past it raises an
out-of-memory error in this process, which the engine and the trainer already survive, instead
of taking the other process's memory); `release_cached` hands the allocator's cached, unused
blocks back to the driver (`torch.cuda.empty_cache`), so what a trainer step freed is free for
the server between steps. Both do nothing off CUDA.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from clawrl.model.budget import Shape, allocator_fraction


def cuda_index(device: str, cuda_available: bool) -> int | None:
    """The GPU `device` names ('auto' is GPU 0 where CUDA is available), or None: not a GPU."""
    if device == "auto":
        return 0 if cuda_available else None
    name, _, index = device.partition(":")
    return int(index or 0) if name == "cuda" else None


def gpu_totals() -> tuple[int, ...]:
    """Every visible GPU's total memory in bytes, by index (empty without CUDA)."""
    if not torch.cuda.is_available():
        return ()
    return tuple(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def model_facts(folder: Path) -> tuple[Shape, int, dict]:
    """The model's shape, its parameter count (from the safetensors headers; the shape's formula
    where there are none) and its config.json."""
    config = json.loads((folder / "config.json").read_text())
    shape = Shape.from_config(config)
    counted = sum(_parameters(path) for path in sorted(folder.glob("*.safetensors")))
    return shape, counted or shape.params(), config


def _parameters(path: Path) -> int:
    """Elements of every tensor a safetensors file holds, read from its header alone."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def cap_process(device: torch.device | str, share: float | None) -> None:
    """Cap this process's allocator on `device` at its `share` of the GPU, less its CUDA context,
    and make `device` the current one: a call that names no device (`empty_cache`, a bare
    `.cuda()`) then lands on the GPU the placement plan gave this process, never on GPU 0."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if share is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(allocator_fraction(share, total), device)


def release_cached(device: torch.device | str) -> None:
    """Hand the allocator's cached, unused blocks back, for the other process on this GPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
