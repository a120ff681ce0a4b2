"""FSDP's loading: the model built on the meta device, sharded, then each rank filled with its own shards.

Under `train.distributed.strategy = "fsdp"` no rank holds the whole model, not even while it loads
(`build_policy`, `clawrl/train/policy.py`):

1. `load_model(..., empty=True)`: the parameters on the meta device (no memory), the buffers (the
   rotary tables, which no checkpoint holds) computed on the CPU;
2. `shard_model` (`train/shards.py`): each parameter becomes this rank's shard, still on meta;
3. `materialize`: the shards get memory on the rank's device (`to_empty`, uninitialised) and the
   buffers are put back;
4. `fill_shards`: each shard read from the folder's safetensors files by slice
   (`safe_open(...).get_slice`): a rank reads 1/N of every weight, cast to its dtype;
5. a LoRA adapter, which no checkpoint holds, starts where one process's does (`init_adapter`).

The frozen reference of full fine-tuning is built the same way from the checkpoint (never copied
from the trained model), in the dtype one process keeps it in: bf16 on a GPU (half of float32, and
read without gradient only), float32 on a CPU (as one process, so that the KL term of clawrl's tests
under gloo matches one process's within float tolerance).

`fill_shards` also loads a full-weight version into a sharded model (`train/checkpoints.py`) and
the base again (`Policy.load(None)`): a rank never reads a whole state dict.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from clawrl.train.shards import copy_whole
from clawrl.version_folder import ADAPTER_WEIGHTS, AdapterError, check_names, is_sharded, weights_pruned


def fill_sharded(model: nn.Module, folder: Path, device: torch.device) -> None:
    """Give a sharded meta `model` memory on `device` and its weights from `folder` (steps 3 to 5)."""
    from peft import PeftModel

    materialize(model, device)
    fill_shards(folder, model)
    if isinstance(model, PeftModel):
        init_adapter(model)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Memory on `device` for every parameter (uninitialised); the buffers keep their values."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    if meta := [name for name, b in buffers.items() if b.is_meta]:
        raise ValueError(f"buffers on the meta device cannot be restored: {meta[:3]}")
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])


def fill_shards(folder: Path, model: nn.Module) -> None:
    """Copy the weights in `folder`'s `*.safetensors` into `model`, each rank reading only the slice
    of each tensor it holds. A LoRA adapter's weights are left alone. Checked first, as
    `load_full_weights` checks: on an `AdapterError` nothing has changed."""
    from safetensors import safe_open

    own = checkpoint_names(model)
    files = sorted(p for p in Path(folder).glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        pruned = " (pruned: train.keep_versions)" if weights_pruned(folder) else ""
        raise AdapterError(f"{folder} holds no model weights (*.safetensors){pruned}")
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu")) for f in files]
        where = {key: h for h in handles for key in h.keys()}  # noqa: SIM118 (a handle is no mapping)
        _check(where, own)
        with torch.no_grad():
            for key, handle in where.items():
                _copy_part(handle, key, own[key])


def checkpoint_names(model: nn.Module) -> dict[str, Tensor]:
    """`model`'s weights (and persistent buffers) under the names its checkpoint gives them: the
    Hugging Face model's, without PEFT's `base_layer` (a LoRA adapter's own weights left out)."""
    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {
        name.replace(".base_layer.", "."): t
        for name, t in root.state_dict(keep_vars=True).items()
        if ".lora_" not in name
    }


def _check(where: dict[str, Any], own: dict[str, Tensor]) -> None:
    check_names(where.keys(), own)
    for key, handle in where.items():
        shape = tuple(handle.get_slice(key).get_shape())
        if shape != tuple(own[key].shape):
            raise AdapterError(f"{key}: the weights are {shape}, the model {tuple(own[key].shape)}")


def _copy_part(handle: Any, key: str, like: Tensor) -> None:
    """`like` (or this rank's shard of it) from `handle`'s tensor `key`, reading only that shard."""
    if not is_sharded(like) or like.dim() == 0:
        like.copy_(handle.get_tensor(key).to(like.device, like.dtype))
        return
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    size, offset = compute_local_shape_and_global_offset(like.shape, like.device_mesh, like.placements)
    part = handle.get_slice(key)[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))]
    like.to_local().copy_(part)


def init_adapter(model: Any) -> None:
    """The active LoRA adapter of a materialised (sharded) PeftModel as `attach_lora` makes it on real
    weights under `torch.manual_seed(0)` (`build_policy`): PEFT draws, module by module, A and B
    as `nn.Linear` initialises them, then A again (Kaiming-uniform), and sets B to zero. Each rank
    draws every whole A and copies its shard, so the ranks hold one adapter; a test checks it equals
    PEFT's own."""
    from peft.tuners.lora import LoraLayer

    name = model.active_adapter
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for module in model.modules():
            if not isinstance(module, LoraLayer) or name not in module.lora_A:
                continue
            a, b = module.lora_A[name].weight, module.lora_B[name].weight
            whole_a = _kaiming(tuple(a.shape))  # nn.Linear's own init of A ...
            _kaiming(tuple(b.shape))  # ... and of B, drawn before PEFT zeroes it
            whole_a = _kaiming(tuple(a.shape))  # PEFT's reset_lora_parameters
            base = module.get_base_layer().weight.dtype  # PEFT casts it to the base's dtype, then back
            copy_whole(a, whole_a.to(base))
            copy_whole(b, torch.zeros(b.shape, dtype=b.dtype))


def _kaiming(shape: tuple[int, ...]) -> Tensor:
    return nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5))
