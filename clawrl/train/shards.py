"""FSDP for the trainer: shard a model over the ranks, gather it whole for a version, load into shards.

`train.distributed.strategy = "fsdp"` shards every weight, gradient and optimizer state over
the ranks with torch's FSDP2 (`fully_shard`, the sharding accelerate's FSDP plugin applies with
`fsdp_version: 2`), called here rather than through the plugin so that the same code runs on a
CPU under gloo in clawrl's tests (accelerate runs its plugin on accelerators only):

- `shard_model`: each decoder layer is one unit (its weights are gathered for its forward and
  backward, then freed), and so are untied embeddings and LM head (1.2B parameters at 8B: in the
  root they would stay gathered from the forward to the end of the backward, the LM head's
  gradient whole until then); the model itself is the root (the final norm, and embeddings tied
  to the LM head, one parameter used at both ends of the model). A PEFT
  model is sharded at its Hugging Face model, so `generate` (the canary's greedy answers) runs
  through the root's hooks too. On a GPU the gathered weights are bf16 and the gradients are
  reduced in float32 (`MixedPrecisionPolicy`): the sharded float32 weights stay the master copy.
  A model without trainable weights (the reference) frees its root's gathered weights (the
  embeddings and LM head) after each forward; FSDP's default keeps them whole until a backward
  that a frozen model never runs.
- `full_state`: the whole model's and optimizer's state on rank 0 (CPU), for a version folder;
  a collective (every rank calls it). The optimizer's state is written as one process writes
  it (`Optimizer.state_dict()`: parameters numbered in order), so a version saved by any
  strategy loads under any other.
- `local_part` and `local_optimizer_state`: a whole tensor (read from a version folder by every
  rank; `optimizer.pt` mapped, not read, so no rank holds the whole AdamW state) cut to the shard
  this rank holds, with no communication, so each rank loads a version on its own, as the DDP
  ranks do. A full-weight version's weights are read by slice instead (`train/meta_load.py`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from clawrl.version_folder import is_sharded, local_part

LAYER_NAMES = ("layers", "h", "blocks")  # where Hugging Face causal LMs keep their decoder layers


def shard_model(model: nn.Module, bf16: bool) -> nn.Module:
    """Shard `model` in place (each decoder layer a unit, the HF model the root); returns it.

    `bf16`: gather weights as bf16 for compute and reduce gradients in float32 (GPUs)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtypes = {p.dtype for p in root.parameters()}
    # FSDP gathers a unit's weights in one dtype: a bf16 base with a float32 LoRA adapter needs one.
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16 or len(dtypes) > 1
        else MixedPrecisionPolicy()
    )
    layers = decoder_layers(root)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    embed, head = root.get_input_embeddings(), root.get_output_embeddings()
    # Untied embeddings and LM head are units of their own; a tied weight is one parameter used at
    # both ends of the model, so it stays in the root.
    if head is not None and head.weight is not embed.weight:
        fully_shard(embed, mp_policy=policy)
        fully_shard(head, mp_policy=policy)
    # FSDP keeps the root's weights gathered from its forward until the backward frees them; a frozen
    # model (full fine-tuning's reference) has no backward, so it frees them after each forward.
    frozen = not any(p.requires_grad for p in root.parameters())
    fully_shard(root, mp_policy=policy, reshard_after_forward=True if frozen else None)
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Hugging Face causal LM: the longest ModuleList named like one."""
    found = [m for name, m in model.named_modules() if name.split(".")[-1] in LAYER_NAMES]
    lists = [m for m in found if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"no decoder layers ({', '.join(LAYER_NAMES)}) found in {type(model).__name__}")
    return list(max(lists, key=len))


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict] | None:
    """(model state, optimizer state as `Optimizer.state_dict()` gives it), whole, on CPU, on rank 0;
    None on the other ranks. Every rank must call it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=whole)
    optim = get_optimizer_state_dict(model, optimizer, options=whole)
    if dist.get_rank() != 0:
        return None
    # A tied weight (an LM head tied to the embeddings) once, under its first name, as
    # `save_pretrained` writes it from the model itself.
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            weights.pop(name, None)
        seen.add(id(tensor))
    return weights, numbered(optim)


def numbered(optim: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names as `Optimizer.state_dict()` keys it (0, 1, ...
    over the groups' parameters in order)."""
    index: dict[str, int] = {}
    groups = []
    for group in optim["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    return {"state": {index[name]: s for name, s in optim["state"].items()}, "param_groups": groups}


def copy_whole(param: Tensor, whole: Tensor) -> None:
    """Copy a whole tensor into `param` (or into this rank's shard of it), without gradient."""
    with torch.no_grad():
        param.copy_(local_part(whole, param))


def local_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A saved (whole) optimizer state cut to the shards of `optimizer`'s parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(is_sharded(p) for p in params):
        return state
    out = {}
    for i, entry in state["state"].items():
        p = params[int(i)]
        out[i] = {k: _local_state(v, p) for k, v in entry.items()}
    return {**state, "state": out}


def _local_state(value: Any, param: Tensor) -> Any:
    """One entry of a parameter's saved optimizer state as this rank keeps it: its shard of a moment,
    a copy of anything else (a tensor of a file mapped by `torch.load(mmap=True)` would keep the
    whole file mapped, and on disk once pruned, for as long as the step count lives)."""
    if not isinstance(value, Tensor):
        return value
    return local_part(value, param) if value.shape == param.shape and value.dim() else value.clone()


def grad_norm_value(norm: Tensor) -> float:
    """`clip_grad_norm_`'s total norm as a float (a sharded model's is a DTensor over the ranks)."""
    return float(norm.full_tensor() if is_sharded(norm) else norm)
