"""The trainer's process group: one process, or N ranks under accelerate.

The trainer code is one path for both. A `RankGroup` says which rank this process
is, and does the few collective things a step needs:

- `broadcast(obj)`: rank 0's object on every rank (the loop's plan for the
  next pass: stop, wait, follow a version, or train these samples);
- `prepare(model)`: the module the gradient pass runs through (DDP-wrapped by
  accelerate under a group, the model itself alone);
- `no_sync(module, skip)` and `backward(loss)`: gradients are reduced by DDP
  in the backward of each rank's last micro-batch (never by hand);
- `sum(values)`: the step's metrics, summed over the ranks; `gather(value)`: every rank's
  figure (each rank's peak memory).

Under FSDP (`FsdpGroup`, `train/shards.py`) a rank holds a shard of every weight, so every
forward and backward is a collective: the group runs in `lockstep`. Every rank makes the
same passes (the trainer splits a rank's micro-batches to match the rank with the most, a
zero-weight pass only where a rank has fewer rows than passes, and scores a teacher pass
wherever any rank needs one), reduce-scatters its gradients after every micro-batch (a rank
keeps its shard of the gradient, never the whole), runs the canary with rank 0, and joins the
gather of the whole state (`full_state`) that rank 0 writes as the version.

How a step is shared (`split_by_tokens`): rank 0 broadcasts the step's
samples, and each rank trains the share this pure function gives it, so every
rank computes the same split without another message. The split balances the
tokens each rank scores (longest first, to the least-loaded rank), and gives
every rank at least one sample (`train.batch_size >= num_processes`).

The same token-level mean as one process: each micro-batch's loss is its
tokens' sum divided by the *step's* token count (all ranks together), and DDP
averages the ranks' gradients, so each rank's loss is multiplied by the world
size (`grad_scale`): the sum over ranks of (world x share) / world is the
one-process gradient.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from clawrl.config import DistributedConfig

log = logging.getLogger("clawrl.trainer")


def split_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of `lengths` in `parts` shares of balanced total length, each in its original order.

    Longest first, each to the share with the fewest tokens so far (ties: the lowest share).
    With at least `parts` items every share gets one.
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    shares: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, k) for k in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, k = heapq.heappop(heap)
        shares[k].append(i)
        heapq.heappush(heap, (load + lengths[i], k))
    return [sorted(share) for share in shares]


class RankGroup:
    """One process, alone: no collectives (today's trainer, unchanged)."""

    rank = 0
    world = 1
    grad_scale = 1.0
    lockstep = False  # True: every forward is a collective (FSDP), every rank makes every pass

    def __init__(self, device: str = "auto") -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        return obj

    def shard(self, model: nn.Module) -> nn.Module:
        """`model` as this group holds it, before its optimizer is made (sharded under FSDP)."""
        return model

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    def full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict] | None:
        """The whole state for a version folder when the live objects do not hold it (FSDP; rank 0
        only; every rank calls it); None: save the model and optimizer themselves."""
        return None

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module, skip: bool) -> Iterator[None]:
        yield

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        return values

    def min(self, value: float) -> float:
        """The smallest of every rank's `value`."""
        return value

    def gather(self, value: float) -> list[float]:
        """Every rank's `value`, rank 0 first."""
        return [value]

    def close(self) -> None:
        pass


class AccelerateGroup(RankGroup):
    """This process as one rank of a group launched by torch's elastic launcher, through accelerate.

    gloo on a CPU, NCCL on GPUs; mixed precision (`cfg.mixed_precision`) on GPUs only.
    """

    def __init__(self, cfg: DistributedConfig) -> None:
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        cuda = torch.cuda.is_available()
        self.accelerator = Accelerator(
            cpu=not cuda,
            mixed_precision=cfg.mixed_precision if cuda else "no",
            # Rank 0 broadcasts a plan every poll; a rank only waits long while rank 0 saves or loads.
            kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=30))],
        )
        kind = self.accelerator.distributed_type
        if not kind.name.startswith("MULTI_"):  # e.g. an accelerate config file that asks for FSDP
            raise RuntimeError(
                f"clawrl's trainer group shards the model itself (train.distributed.strategy); "
                f"accelerate set up {kind.name} instead: launch it without an FSDP or DeepSpeed plugin"
            )
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.grad_scale = float(self.world)  # DDP averages the ranks' gradients; the loss is a sum share
        self.device = str(self.accelerator.device)

    def broadcast(self, obj: Any) -> Any:
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def prepare(self, model: nn.Module) -> nn.Module:
        return self.accelerator.prepare_model(model)

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module, skip: bool) -> Iterator[None]:
        """Without reducing gradients when `skip` (all but a rank's last micro-batch of a step)."""
        with self.accelerator.no_sync(module) if skip else contextlib.nullcontext():
            yield

    def backward(self, loss: Tensor) -> None:
        self.accelerator.backward(loss)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        device = self.accelerator.device
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
        total = self.accelerator.reduce(t, reduction="sum")
        return dict(zip(keys, total.tolist(), strict=True))

    def min(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.accelerator.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return float(t.item())

    def gather(self, value: float) -> list[float]:
        from accelerate.utils import gather_object

        return [float(v) for v in gather_object([value])]

    def close(self) -> None:
        self.accelerator.end_training()  # destroys the process group


class FsdpGroup(AccelerateGroup):
    """A rank of a group that shards the model (FSDP2, `train/shards.py`); see the module docstring."""

    lockstep = True

    def __init__(self, cfg: DistributedConfig) -> None:
        super().__init__(cfg)
        self.bf16 = torch.cuda.is_available() and cfg.mixed_precision == "bf16"

    def shard(self, model: nn.Module) -> nn.Module:
        from clawrl.train.shards import shard_model

        return shard_model(model, self.bf16)

    def prepare(self, model: nn.Module) -> nn.Module:
        return model  # sharded already (`shard`): FSDP reduce-scatters the gradients, averaged

    def full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict] | None:
        from clawrl.train.shards import full_state

        return full_state(model, optimizer)

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module, skip: bool) -> Iterator[None]:
        """Gradients are reduce-scattered in every micro-batch's backward, whatever `skip` says: each
        rank accumulates its shard of the gradient, never a whole unsharded one (FSDP2 without
        gradient sync keeps full gradients until the last micro-batch: 16-33 GB at 8B). One
        reduce-scatter per micro-batch costs bandwidth, not memory; their sum is the step's."""
        root = module.get_base_model() if hasattr(module, "get_base_model") else module
        root.set_requires_gradient_sync(True)
        yield


FSDP_ON_CPU = "CLAWRL_FSDP_ON_CPU"  # clawrl's own tests: the FSDP path under gloo on a CPU


def strategy_refusal(cfg: DistributedConfig) -> str | None:
    """Why the trainer cannot start with this strategy here (None: it can)."""
    if cfg.strategy != "fsdp" or torch.cuda.is_available() or os.environ.get(FSDP_ON_CPU) == "1":
        return None
    return (
        "train.distributed.strategy = 'fsdp' needs CUDA GPUs and this machine has none (sharding "
        "pays on GPUs, where one device cannot hold the weights and optimizer state); use 'ddp', "
        "or LoRA, which fits one device (docs/scale.md)"
    )


def open_group(cfg: DistributedConfig, world: int, device: str = "auto") -> RankGroup:
    """The group of a process started as one of `world` ranks (1: a plain process)."""
    if world <= 1:
        return RankGroup(device)
    return FsdpGroup(cfg) if cfg.strategy == "fsdp" else AccelerateGroup(cfg)
