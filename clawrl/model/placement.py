"""Placement: which GPU each process takes (the server, the trainer or each of its ranks) and the
share of that GPU's memory each keeps to, for every topology. Pure; the arithmetic of a share is
`budget.py`'s, which this module runs once per GPU a trainer process takes.

The rules, in order:

- the server takes `model.device`'s GPU;
- a one-process trainer: `budget.plan`'s rule (a GPU of its own from 3.5B parameters on two GPUs
  or more, else beside the server);
- a group of N ranks (DDP or FSDP) takes one GPU a rank (NCCL refuses two ranks on one GPU):
  the GPUs other than the server's, in order, as many as it needs; with N equal to every GPU
  the last rank shares the server's GPU, and its share and the server's are planned together
  as one trainer beside the server (its need with the margin; the server the rest). Rank 0 (the
  store, the canary, publishing) never shares. More ranks than GPUs are refused.

The plan is enforced by `CUDA_VISIBLE_DEVICES` (`visible_devices`): vLLM is started with the
server's GPU alone, the trainer group's launcher hands its ranks their GPUs in rank order, so
rank r's `cuda:LOCAL_RANK` is the plan's GPU r and never GPU 0 by accident. A layout that cannot
fit is a `BudgetRefused` with the arithmetic; `describe` is what `clawrl serve --dry-run` prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from clawrl.model.budget import (
    ALONE_SHARE,
    GIB,
    PROCESS_OVERHEAD,
    SERVER_WORKSPACE,
    SLACK,
    SPLIT_FROM,
    TRAINER_MARGIN,
    Budget,
    BudgetRefused,
    Server,
    Shape,
    TrainerNeed,
    plan,
)


@dataclass(frozen=True)
class Ranks:
    """A trainer group as configured: its size and, where set, each rank's GPU and share."""

    count: int = 1  # train.distributed.num_processes
    gpus: tuple[int, ...] | None = None  # train.distributed.gpus
    shares: tuple[float, ...] | None = None  # train.distributed.gpu_shares


def place(
    *,
    shape: Shape,
    params: int,
    gpus: tuple[int, ...],
    server: Server,
    trainer: TrainerNeed | None,
    ranks: Ranks = Ranks(),
    dtype_bytes: int = 2,
) -> Budget:
    """The plan on `gpus` (each one's total bytes, by index); BudgetRefused with the numbers."""
    if not 0 <= server.gpu < len(gpus):
        raise BudgetRefused(f"model.device names GPU {server.gpu}, but {_there(len(gpus))}")
    if trainer is None or ranks.count == 1:
        return plan(
            shape=shape, params=params, gpus=gpus, server=server, trainer=trainer, dtype_bytes=dtype_bytes
        )
    where = ranks.gpus or rank_gpus(server.gpu, len(gpus), ranks.count)
    _check_asked(where, len(gpus))
    plans = []
    for rank, gpu in enumerate(where):
        share = ranks.shares[rank] if ranks.shares else trainer.share
        one = replace(trainer, device=f"cuda:{gpu}", share=share)
        try:
            plans.append(
                plan(
                    shape=shape, params=params, gpus=gpus, server=server, trainer=one, dtype_bytes=dtype_bytes
                )
            )
        except BudgetRefused as exc:
            beside = " beside the server" if gpu == server.gpu else ""
            raise BudgetRefused(f"trainer rank {rank} on GPU {gpu}{beside}: {exc}") from None
    # The server's share and KV are the ones planned beside the rank that shares its GPU, if one does.
    b = next((p for p, gpu in zip(plans, where, strict=True) if gpu == server.gpu), plans[0])
    return replace(b, rank_gpus=tuple(where), rank_shares=tuple(p.trainer_share or 0.0 for p in plans))


def rank_gpus(server_gpu: int, count: int, ranks: int) -> tuple[int, ...]:
    """Each rank's GPU by rank: the others' first, the server's last (module docstring)."""
    others = tuple(i for i in range(count) if i != server_gpu)
    if ranks <= len(others):
        return others[:ranks]
    if ranks == count:
        return (*others, server_gpu)
    raise BudgetRefused(
        f"train.distributed.num_processes {ranks}: the plan places at most {_n(count, 'rank')} on "
        f"{_n(count, 'GPU')} (one rank a GPU, the server's GPU {server_gpu} taking the last one "
        f"beside it); ask for {count} or fewer"
    )


def _check_asked(where: tuple[int, ...], count: int) -> None:
    missing = [g for g in where if not 0 <= g < count]
    if missing:
        raise BudgetRefused(
            f"train.distributed.gpus {list(where)} names GPU {missing[0]}, but {_there(count)}"
        )
    if len(set(where)) < len(where):
        raise BudgetRefused(f"train.distributed.gpus {list(where)}: two ranks on one GPU (NCCL refuses it)")


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


def _there(count: int) -> str:
    return f"{count} are visible" + (f" (0-{count - 1})" if count else "")


def per_gpu(b: Budget) -> dict[int, float]:
    """The shares planned on each GPU, summed: the server's and every trainer process's there."""
    sums = dict.fromkeys(range(len(b.gpu_bytes)), 0.0)
    sums[b.server_gpu] += b.server_share
    for gpu, share in _trainer_seats(b):
        sums[gpu] += share
    return sums


def _trainer_seats(b: Budget) -> list[tuple[int, float]]:
    if b.rank_gpus:
        return list(zip(b.rank_gpus, b.rank_shares, strict=True))
    if b.trainer_gpu is not None and b.trainer_share is not None:
        return [(b.trainer_gpu, b.trainer_share)]
    return []


def visible_devices(indices: tuple[int, ...], inherited: str | None) -> str:
    """`CUDA_VISIBLE_DEVICES` for a child that sees the GPUs `indices` (this process's numbering)
    in that order. `inherited`: this process's own value, whose i-th entry GPU i is."""
    names = [n.strip() for n in inherited.split(",")] if inherited else None
    return ",".join(names[i] if names else str(i) for i in indices)


def parse_gpus(spec: str) -> tuple[int, ...]:
    """`--gpus` of a dry run: '8x80' is eight GPUs of 80 GiB; '80' one; '2x80,1x24' mixed."""
    gpus: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*", part)
        if m is None or int(m.group(1) or 1) < 1 or float(m.group(2)) <= 0:
            raise ValueError(f"--gpus {spec!r}: write COUNTxGiB, e.g. 8x80 (eight GPUs of 80 GiB)")
        gpus += [int(float(m.group(2)) * GIB)] * int(m.group(1) or 1)
    return tuple(gpus)


def describe(
    b: Budget, *, server: Server, trainer: TrainerNeed | None, ranks: Ranks, params: int, engine: str
) -> str:
    """The plan for a person: each GPU, what runs there with its share and why, and the
    `CUDA_VISIBLE_DEVICES` each process is started with (`clawrl serve --dry-run`)."""
    lines = []
    for gpu, total in enumerate(b.gpu_bytes):
        used = per_gpu(b)[gpu]
        lines.append(f"GPU {gpu} ({_gib(total)} GiB): " + (f"{used:.2f} planned" if used else "idle"))
        if gpu == b.server_gpu:
            lines.append(_seat(f"server ({engine})", b.server_share, total, _server_why(b, server)))
        for rank, (g, share) in enumerate(_trainer_seats(b)):
            if g == gpu:
                who = f"trainer rank {rank}" if b.rank_gpus else "trainer"
                why = _trainer_why(b, trainer, ranks, params, rank=rank, gpu=g)
                lines.append(_seat(who, share, total, why))
    lines.append(_enforced(b, engine))
    if b.train_seq_len is not None:
        lines.append(f"the trainer trains samples up to {b.train_seq_len:,} tokens: the window does not fit")
    return "\n".join(lines)


def _enforced(b: Budget, engine: str) -> str:
    """How each process is held to its GPU."""
    if engine == "vllm":
        text = f"vLLM starts with CUDA_VISIBLE_DEVICES={b.server_gpu} (its device 0)"
    elif engine == "vllm attached":
        text = (
            f"start the attached vLLM with CUDA_VISIBLE_DEVICES={b.server_gpu} and "
            f"--gpu-memory-utilization {b.server_share:.2f}"
        )
    else:
        text = f"the local engine runs on cuda:{b.server_gpu} in the server's process"
    if b.rank_gpus:
        gpus = ",".join(str(g) for g in b.rank_gpus)
        text += f"; the trainer's launcher gives its ranks CUDA_VISIBLE_DEVICES={gpus} (rank r the r-th)"
    elif b.trainer_gpu is not None:
        text += f"; the trainer runs on cuda:{b.trainer_gpu} (train.device)"
    return text


def _seat(who: str, share: float, total: int, why: str) -> str:
    return f"  {who:<16} {share:.2f}  {_gib(share * total):>5} GiB  {why}"


def _server_why(b: Budget, server: Server) -> str:
    shared = any(g == b.server_gpu for g, _ in _trainer_seats(b))
    if server.share is not None:
        how = "engine.gpu_share as configured"
    elif shared:
        how = f"what the trainer's share leaves, less {SLACK:g} for no one"
    else:
        how = f"alone on its GPU: {ALONE_SHARE:g}, vLLM's own default"
    window = b.window_kv_bytes // max(1, b.kv_per_token)
    adapters = 8 * server.adapter_params + server.adapter_bytes
    slots = f" in {server.adapter_slots} slots" if server.adapter_slots else ""
    text = (
        f"{how}; needs >= {_gib(b.server_floor)} GiB (weights {_gib(b.weights_bytes)}, a {window:,}-token "
        f"window's KV {_gib(b.window_kv_bytes)}, workspace {_gib(SERVER_WORKSPACE)}, context "
        f"{_gib(PROCESS_OVERHEAD)}, adapters {_gib(adapters)}{slots})"
    )
    if server.adapter_host_bytes:
        text += f"; adapters in pinned host memory {_gib(server.adapter_host_bytes)} GiB"
    return text


def _trainer_why(
    b: Budget, trainer: TrainerNeed | None, ranks: Ranks, params: int, *, rank: int, gpu: int
) -> str:
    need = f"needs about {_gib((b.trainer_bytes or 0) + PROCESS_OVERHEAD)} GiB"
    if trainer is not None and trainer.shards > 1:
        need += f" (its 1/{trainer.shards} of the state: FSDP)"
    if gpu == b.server_gpu:
        how = f"beside the server: its need x {TRAINER_MARGIN:g} and its context"
        if b.rank_gpus:
            every = f"{ranks.count} ranks on {len(b.gpu_bytes)} GPUs"
            how = f"{every}: the last beside the server, the group at its pace; {how}"
    elif b.rank_gpus:
        how = "train.distributed.gpus as configured" if ranks.gpus else "a GPU of its own"
    elif trainer is not None and trainer.device is not None:
        how = f"train.device {trainer.device} as configured"
    else:
        how = f"a GPU of its own: {params / 1e9:.2f}B parameters >= {SPLIT_FROM / 1e9:g}B on 2+ GPUs"
    if (trainer is not None and trainer.share is not None) or ranks.shares:
        how += "; its share as configured"
    return f"{how}; {need}"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"
