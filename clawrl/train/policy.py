"""The trainer's policy: the model it updates, its optimizer, and its reference.

Two kinds of weights (`train.weights`):

- `lora` (default): the base model wrapped in a PEFT LoRA adapter; only the
  adapter trains. The reference pi_ref is the same model with the adapter
  off, at no extra memory. A version is the adapter (a few MB).
- `full`: every weight trains. A frozen copy of the base is kept as the
  reference only when something needs it (`kl_coef > 0` or
  `opd_teacher = "reference"`). A version is the whole model.

Under FSDP (a lockstep group) no rank loads the whole model: the model, and full fine-tuning's
reference, are built on the meta device, sharded, and each rank reads its shards from the
checkpoint (`train/meta_load.py`).

`Policy.load(folder)` makes the policy the version saved there, optimizer
state included; `Policy.load(None)` makes it the base model (v0) with a fresh
optimizer (LoRA: the adapter as built, B = 0), which is where a new run or a rollback to v0 starts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clawrl.config import TrainConfig
from clawrl.model.load import load_model, resolve_device
from clawrl.train.checkpoints import load_folder
from clawrl.train.group import RankGroup
from clawrl.train.master import MasterWeights
from clawrl.train.meta_load import fill_sharded, fill_shards
from clawrl.train.sizing import resolve
from clawrl.train.trainer import Trainer
from clawrl.train.weights import LoraSettings, attach_lora
from clawrl.version_folder import is_sharded, load_full_weights, read_full_weights


@dataclass
class Policy:
    model: Any  # a peft.PeftModel (lora) or the plain model (full)
    optimizer: torch.optim.Optimizer
    trainer: Trainer
    base_dir: Path
    cfg: TrainConfig
    # LoRA: the adapter as built (A from a fixed seed, B = 0), so v0 is one state whoever trained last:
    # with an adapter per user, a user's first step never starts from another user's A.
    initial: dict[str, torch.Tensor] | None = None
    user: str | None = None  # whose adapter it is now, with an adapter per user; None: everyone's policy

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    def load(self, folder: Path | None) -> dict:
        """Become the version in `folder` (None: the base model, fresh optimizer); returns its manifest."""
        self.optimizer.state.clear()
        if folder is not None:
            manifest = load_folder(folder, self.model, self.optimizer)
            if self.trainer.master is not None:
                self.trainer.master.from_model()
            return manifest
        with torch.no_grad():
            if self.cfg.weights == "lora":
                for name, param in self.model.named_parameters():
                    if self.initial is not None and name in self.initial:
                        param.copy_(self.initial[name])  # as built: B = 0, the policy is the base
                    elif "lora_B" in name:
                        param.zero_()
            elif any(is_sharded(p) for p in self.model.parameters()):
                fill_shards(self.base_dir, self.model)  # each rank its slices (train/meta_load.py)
            else:
                load_full_weights(self.model, read_full_weights(self.base_dir))
            if self.trainer.master is not None:
                self.trainer.master.from_model()
        return {}


def build_policy(
    base_dir: Path,
    cfg: TrainConfig,
    device: str = "auto",
    max_context: int | None = None,
    rope_scaling: str = "yarn",
    group: RankGroup | None = None,
    keep_base: bool = False,
    scale_rope: str = "past_window",
) -> Policy:
    """Load the base model from `base_dir` and make it trainable as `cfg.weights` says.

    The policy's `cfg` is `cfg` with the size-dependent defaults filled in (`train/sizing.py`).
    `max_context`, `rope_scaling` and `scale_rope` must be the server's (`clawrl/engine/local/build.py`): the
    policy trained is the policy served, RoPE scaling included. `group`: the ranks this process
    trains with (default: alone); `device` is then this rank's. `keep_base`: keep the base at hand
    for full fine-tuning even without KL or a reference teacher (the canary compares every version with it).
    """
    # Train in float32 on a CPU. On a GPU, LoRA: the frozen base in bf16, the adapter in float32
    # (PEFT casts it); full: the model in bf16, as served, AdamW on float32 masters of its weights
    # (train/master.py), so small updates are not rounded away; FSDP keeps float32 shards as the
    # masters and computes in bf16 itself (train/shards.py).
    group = group or RankGroup()
    sharded = group.lockstep  # FSDP: built on the meta device, each rank reads its shards (meta_load.py)
    dtype = "float32" if cfg.weights == "full" else "auto"
    dev = resolve_device(device)
    loaded = load_model(
        path=Path(base_dir),
        device=device,
        dtype=dtype,
        max_context=max_context,
        rope_scaling=rope_scaling,
        scale_rope=scale_rope,
        empty=sharded,
    )
    base = loaded.model
    on_gpu = dev.type == "cuda"
    size = sum(p.numel() for p in base.parameters())
    cfg = resolve(
        cfg=cfg,
        parameters=size,
        model_type=getattr(base.config, "model_type", None),
        on_gpu=on_gpu,
        window=loaded.max_context,
    )
    reference: nn.Module | None = None
    if cfg.activation_checkpointing:  # recomputed layers give the same gradients (no dropout in them)
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.weights == "lora":
        lora = cfg.lora
        # A fixed seed for LoRA's random A: every run (and every rank of a group) starts from the same v0.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = attach_lora(base, LoraSettings(lora.rank, lora.alpha, lora.dropout, list(lora.targets)))
    else:
        model = base
        if keep_base or cfg.kl_coef > 0 or cfg.opd_teacher == "reference" or cfg.replay_fraction > 0:
            rope = (max_context, rope_scaling, scale_rope)
            reference = _reference(
                base=base, base_dir=Path(base_dir), device=device, on_gpu=on_gpu, sharded=sharded, rope=rope
            )
        model.requires_grad_(True)
    model = group.shard(model)  # before the optimizer: under FSDP it holds the shards
    if reference is not None:
        reference = group.shard(reference)
    if sharded:
        for module in (model, reference) if reference is not None else (model,):
            fill_sharded(module, Path(base_dir), dev)
    model.eval()
    master = None
    if cfg.weights == "full" and _bf16_masters(cfg.precision, on_gpu, group):
        model.to(torch.bfloat16)
        master = MasterWeights(model)
    params = master.params if master else [p for p in model.parameters() if p.requires_grad]
    # fused on a GPU (one process): foreach AdamW makes a float32 temporary the size of the trained
    # weights each step (sqrt of its second moment), 4 bytes a parameter: 16 GB at 4B full, measured
    fused = True if on_gpu and not sharded else None
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
    trainer = Trainer(
        model=model, optimizer=optimizer, cfg=cfg, reference=reference, group=group, master=master
    )
    initial = None
    if cfg.weights == "lora":
        initial = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    return Policy(
        model=model, optimizer=optimizer, trainer=trainer, base_dir=base_dir, cfg=cfg, initial=initial
    )


def _reference(
    base: nn.Module, base_dir: Path, device: str, on_gpu: bool, sharded: bool, rope: tuple
) -> nn.Module:
    """Full fine-tuning's frozen reference, the base model. It is read without gradients only: bf16
    on a GPU is enough, and half the memory of float32. Alone: a copy of `base`, loaded already.
    Sharded: built on the meta device like the model, from the checkpoint (never a whole copy on a
    rank), in the dtype one process keeps it in (float32 on a CPU: train/meta_load.py)."""
    if sharded:
        dtype = "bfloat16" if on_gpu else "float32"
        reference = load_model(base_dir, device, dtype, *rope, empty=True).model
    else:
        reference = copy.deepcopy(base)
        if on_gpu:
            reference = reference.to(torch.bfloat16)
    return reference.eval().requires_grad_(False)


def _bf16_masters(precision: str, on_gpu: bool, group: RankGroup) -> bool:
    """Whether full fine-tuning computes in bf16 on float32 masters here (`train.precision`)."""
    if group.lockstep:  # FSDP: its mixed precision keeps float32 shards as the masters already
        return False
    return precision == "bf16" or (precision == "auto" and on_gpu)
