"""What `clawrl serve` decides at start, before it loads anything: which engine serves
(`engine.kind = "auto"`, `clawrl/engine/choice.py`) and, on a GPU, the memory budget
(`clawrl/model/budget.py`) and its placement (`clawrl/model/placement.py`): the server's GPU, the
trainer's or each of its ranks', every share, the local engine's prefix cache and batch KV. The
decisions go into the config, which is written again to `<run_dir>/config.json`, so the trainer
`clawrl serve` starts reads the same ones. `clawrl serve --dry-run` prints them (`dry_run`), on
this machine's GPUs or on GPUs described (`--gpus 8x80`), and starts nothing.

A start that cannot work is refused here (`StartRefused`, exit status 2) with the numbers,
never left to an out-of-memory restart loop. On a CPU nothing changes but the engine kind
("auto" is the local engine there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from pydantic import ValidationError

from clawrl.config import Config
from clawrl.engine.registry import resolve_kind
from clawrl.model import budget, placement
from clawrl.model.adapter_slots import adapter_memory
from clawrl.model.gpu import cuda_index, gpu_totals, model_facts
from clawrl.model.load import model_folder, served_context
from clawrl.train.sizing import CONSERVATIVE, rule_for

log = logging.getLogger(__name__)
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}  # "auto" is bfloat16 on CUDA


class StartRefused(ValueError):
    """A configuration that cannot work on this machine; the message says why and what would."""


@dataclass(frozen=True)
class Planned:
    """The plan and what it was made of, for `placement.describe`."""

    budget: budget.Budget
    server: budget.Server
    trainer: budget.TrainerNeed | None
    ranks: placement.Ranks
    params: int


def plan_start(config: Config) -> Config:
    """`config` with the engine kind and (on a GPU) the memory budget decided; StartRefused."""
    config, planned = decide(config, None)
    if planned is not None:
        log.info("memory budget: %s", planned.budget.summary())
        log.info("placement:\n%s", _described(config, planned))
        config = with_budget(config, planned.budget)
    return config


def dry_run(config: Config, gpus: tuple[int, ...] | None) -> str:
    """What `clawrl serve --dry-run` prints: the plan on `gpus` (each one's total bytes; None:
    this machine's), or why there is none; StartRefused as a start would be."""
    config, planned = decide(config, gpus)
    if planned is None:
        if cuda_index(config.model.device, True) is None:
            return f"model.device {config.model.device}: the server and the trainer run on the CPU"
        return "no GPU visible: the server and the trainer run on the CPU (describe GPUs with --gpus 8x80)"
    return _described(config, planned)


def decide(config: Config, gpus: tuple[int, ...] | None) -> tuple[Config, Planned | None]:
    """`config` with the engine kind decided, and the plan on `gpus` (None: this machine's), or
    None where nothing runs on a GPU; StartRefused."""
    cuda = bool(gpus) if gpus is not None else torch.cuda.is_available()
    gpu = cuda_index(config.model.device, cuda)
    try:
        config = resolve_kind(config, cuda=gpu is not None)
    except ValidationError as exc:  # "auto" chose vLLM and a vLLM rule refuses the rest
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise StartRefused(f"engine.kind 'auto' chose vLLM, but {reasons}") from exc
    if gpu is None:
        return config, None
    folder = model_folder(config.model.path, config.cache_dir())
    try:
        return config, plan_layout(config, folder, gpu, gpu_totals() if gpus is None else gpus)
    except budget.BudgetRefused as exc:
        raise StartRefused(str(exc)) from exc


def _described(config: Config, p: Planned) -> str:
    trainer = f"{config.train.weights} trainer, {_topology(config)}" if p.trainer else "no trainer on a GPU"
    head = f"{p.params / 1e9:.2f}B parameters on {len(p.budget.gpu_bytes)} GPU(s); {trainer}"
    engine = config.engine.kind  # "vllm attached": a vLLM clawrl does not start
    engine += " attached" if engine == "vllm" and not config.engine.vllm.start else ""
    text = placement.describe(
        p.budget, server=p.server, trainer=p.trainer, ranks=p.ranks, params=p.params, engine=engine
    )
    return f"{head}\n{text}"


def _topology(config: Config) -> str:
    d = config.train.distributed
    return "one process" if d.num_processes == 1 else f"{d.num_processes} {d.strategy.upper()} ranks"


def trainer_beside(
    config: Config, window: int, params: int, model_type: str | None, seq_len: int | None = None
) -> budget.TrainerNeed | None:
    """What the trainer `clawrl serve` starts will hold, or None: none, or not on a GPU.
    `seq_len`: its longest sample, when not `train.max_seq_len` (else the served window)."""
    t = config.train
    if not (config.collect.enabled and t.enabled):
        return None
    device = _asked_device(config)
    if device is not None and cuda_index(device, True) is None:
        return None  # a CPU trainer
    rule = rule_for(params, model_type) or CONSERVATIVE
    tokens = max(t.micro_batch_tokens or rule.gpu_micro_batch_tokens, seq_len or t.max_seq_len or window)
    full = t.weights == "full"
    reference = full and (
        config.guard.enabled or t.kl_coef > 0 or t.opd_teacher == "reference" or t.replay_fraction > 0
    )
    shards = t.distributed.num_processes if t.distributed.strategy == "fsdp" else 1
    return budget.TrainerNeed(
        weights=t.weights,
        tokens=tokens,
        lora_rank=t.lora.rank,
        reference=reference,
        shards=shards,
        device=device,
        share=t.gpu_share,
    )


def _asked_device(config: Config) -> str | None:
    """train.device as asked; None (and "auto"): the budget decides."""
    return None if config.train.device in (None, "auto") else config.train.device


SHORTEST_FIT = 8192  # the shortest trainer sample length tried before a layout is refused


def plan_budget(config: Config, folder: Path, gpu: int, gpus: tuple[int, ...]) -> budget.Budget:
    """The budget for this config and model folder on `gpus` (each one's total bytes)."""
    return plan_layout(config, folder, gpu, gpus).budget


def plan_layout(config: Config, folder: Path, gpu: int, gpus: tuple[int, ...]) -> Planned:
    """The budget and placement for this config and model folder on `gpus`, the server on `gpu`.

    With `train.max_seq_len` unset the trainer would train samples as long as the served window;
    where that does not fit beside the server (an 8B model's 40,960-token window on one 80 GB GPU),
    the longest power of two down to SHORTEST_FIT that fits is taken instead (`Budget.train_seq_len`,
    logged at start: longer samples are skipped and counted, as any over `train.max_seq_len`).
    A length the user set is never changed: it fits or is refused."""
    shape, params, model_config = model_facts(folder)  # read once: the safetensors headers
    window = served_context(config.model.path, config.model.max_context)
    window = window or int(model_config.get("max_position_embeddings") or 4096)
    adapters = adapter_memory(config, shape, config.engine.kind, DTYPE_BYTES[config.model.dtype])
    mb = config.engine.prefix_cache_mb
    server = budget.Server(
        gpu,
        window,
        config.engine.gpu_share,
        None if mb is None else mb << 20,
        adapter_params=adapters.shared_params,
        adapter_bytes=adapters.device,
        adapter_host_bytes=adapters.host,
        adapter_slots=adapters.slots,
    )

    d = config.train.distributed
    ranks = placement.Ranks(
        d.num_processes,
        None if d.gpus is None else tuple(d.gpus),
        None if d.gpu_shares is None else tuple(d.gpu_shares),
    )

    def attempt(seq_len: int | None) -> Planned:
        trainer = trainer_beside(
            config=config,
            window=window,
            params=params,
            model_type=model_config.get("model_type"),
            seq_len=seq_len,
        )
        b = placement.place(
            shape=shape,
            params=params,
            gpus=gpus,
            server=server,
            trainer=trainer,
            ranks=ranks,
            dtype_bytes=DTYPE_BYTES[config.model.dtype],
        )
        return Planned(
            budget=replace(b, train_seq_len=seq_len),
            server=server,
            trainer=trainer,
            ranks=ranks,
            params=params,
        )

    try:
        return attempt(None)
    except budget.BudgetRefused:
        if config.train.max_seq_len is not None or window <= SHORTEST_FIT:
            raise
        length = 1 << (window - 1).bit_length() - 1  # the power of two below the window
        while length >= SHORTEST_FIT:
            try:
                return attempt(length)
            except budget.BudgetRefused:
                length //= 2
        raise


def with_budget(config: Config, b: budget.Budget) -> Config:
    """`config` with the budget's decisions in the fields that carry them to the processes."""
    e, t = config.engine, config.train
    engine = {"gpu_share": b.server_share}
    if e.kind == "local":
        engine["prefix_cache_mb"] = (
            b.prefix_cache_bytes >> 20 if e.prefix_cache_mb is None else e.prefix_cache_mb
        )
        engine["batch_kv_mb"] = e.batch_kv_mb or b.batch_kv_bytes >> 20
    elif e.vllm.restart_kv_cache_mb is None:  # a vLLM restart takes the plan's KV, not what is free then
        engine["vllm"] = e.vllm.model_copy(update={"restart_kv_cache_mb": b.kv_bytes >> 20})
    train: dict[str, object] = {}
    if b.train_seq_len is not None:
        log.warning(
            "the trainer trains samples up to %d tokens: at the served window it does not fit beside "
            "the server (longer samples are skipped and counted; set train.max_seq_len, or give the "
            "trainer a GPU of its own with train.device)",
            b.train_seq_len,
        )
        train["max_seq_len"] = b.train_seq_len
    if b.rank_gpus:  # a group: a GPU and a share a rank, handed out by its launcher
        dist = {"gpus": list(b.rank_gpus), "gpu_shares": list(b.rank_shares)}
        train["distributed"] = t.distributed.model_copy(update=dist)
    elif b.trainer_gpu is not None:
        train |= {"device": _asked_device(config) or f"cuda:{b.trainer_gpu}", "gpu_share": b.trainer_share}
    return config.model_copy(
        update={"engine": e.model_copy(update=engine), "train": t.model_copy(update=train)}
    )
