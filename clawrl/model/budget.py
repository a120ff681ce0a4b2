"""The GPU memory budget, decided once at start: which GPU the server and the trainer use, and the
share of it each may take. Pure arithmetic on the model's shape and the config; no torch.

Server and trainer are two processes with two CUDA allocators. Left alone, each takes what it
finds free (vLLM 90% of the GPU, the local engine's prefix cache a quarter of what is free, a
trainer whatever its step needs) and the one that starts second runs out of memory, is
restarted, and runs out again. So `clawrl serve` decides the shares before it loads anything
(`plan`), writes them into the resolved config that both processes read, and each keeps to its
own:

- vLLM is started with `--gpu-memory-utilization` = the server's share;
- the local engine caps its process at its share and admits requests by KV bytes: the running
  batch's KV and the prefix cache together fit what the share leaves after the weights;
- the trainer caps its process at its share (`torch.cuda.set_per_process_memory_fraction`) and
  returns its cached memory after each step (`torch.cuda.empty_cache`).

A share is a fraction of one GPU's total memory and counts everything the process holds there,
its CUDA context included, as vLLM's `--gpu-memory-utilization` does; a torch process caps its
allocator at its share less `PROCESS_OVERHEAD` (`allocator_fraction`). The layout:

| GPUs | model         | server                      | trainer                                   |
| ---- | ------------- | --------------------------- | ----------------------------------------- |
| 1    | any           | what the trainer leaves     | its need x TRAINER_MARGIN, the same GPU   |
| 2+   | >= 4B params  | its GPU, ALONE_SHARE (0.9)  | the next GPU, ALONE_SHARE                 |
| 2+   | < 4B params   | as on one GPU               | as on one GPU                             |

The trainer's need is docs/scale.md's arithmetic (bench/scale_table.py prints it for four
models): its weights and optimizer state, the activations of its longest pass under activation
checkpointing, and its logits. The server's floor is its weights, the KV of one full window
(vLLM refuses to start without that much) and `SERVER_WORKSPACE`. A layout where either does
not fit its share, or the shares add up to more than the GPU, is refused with the numbers
(`BudgetRefused`), never left to an out-of-memory restart loop. Measured on one H200
(`bench/gpu.py`, 2026-11-26): a LoRA trainer's peak at Qwen3-4B and -8B shapes on 16,384-token
passes was 0.93 and 0.95 of its need here with 513 positions' logits (0.60 and 0.72 of today's,
which counts the whole pass's: `Shape.logits_bytes`), so `TRAINER_MARGIN` is headroom for fragmentation;
`PROCESS_OVERHEAD` and `SERVER_WORKSPACE` are still not measured (no vLLM ran on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

GIB = 1 << 30
PROCESS_OVERHEAD = 1 * GIB  # a CUDA context, cuBLAS workspaces: outside torch's caching allocator
SERVER_WORKSPACE = 2 * GIB  # a prefill chunk's activations, the sampler's logits, vLLM's CUDA graphs
TRAINER_MARGIN = 1.15  # a trainer peaked at 0.93-0.95 of its arithmetic on an H200: 15% for fragmentation
ALONE_SHARE = 0.9  # a process alone on its GPU: vLLM's own default utilization
SLACK = 0.02  # of a shared GPU left to no one: rounding, the driver
SPLIT_FROM = 3.5e9  # parameters from which two GPUs are split, one each ("4B": Qwen3-4B has 4.02B)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class BudgetRefused(ValueError):
    """A layout that cannot fit the GPU memory: the message has the numbers and what would fit."""


@dataclass(frozen=True)
class Shape:
    """A dense decoder's shape, from its Hugging Face config.json (Llama, Qwen2/2.5/3, Mistral)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, cfg: dict) -> Shape:
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        return cls(
            layers=cfg["num_hidden_layers"],
            hidden=h,
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or h // heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=cfg.get("model_type") == "qwen3",
        )

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of a layer."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def params(self) -> int:
        """Every parameter, a tied embedding counted once."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = (
            2 * self.hidden
            + (q + 2 * kv if self.qkv_bias else 0)
            + (2 * self.head_dim if self.qk_norm else 0)
        )
        matmuls = sum(a * b for a, b in self.projections().values())
        head = 0 if self.tied else self.vocab * self.hidden
        return self.layers * (matmuls + norms) + self.vocab * self.hidden + head + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...] = TARGETS) -> int:
        return self.layers * sum(rank * (a + b) for n, (a, b) in self.projections().items() if n in targets)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_bytes(self, tokens: int, lora: bool) -> int:
        """One pass of `tokens` under activation checkpointing (docs/scale.md, "How each column is
        made"): every layer's input kept, one layer's saved tensors and their gradients during the
        backward, and PEFT's float32 copies of each adapted projection's input."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = 4 * self.hidden + 3 * q + 3 * kv + 4 * self.intermediate
        kept = tokens * self.hidden * (2 if lora else 4) * self.layers  # full: float32, an upper bound
        peft = tokens * sum(a for a, _ in self.projections().values()) * 4 if lora else 0
        return kept + 2 * tokens * layer * 2 + peft

    def logits_bytes(self, positions: int) -> int:
        """The trainer's logits at `positions` loss positions: bf16, their gradient, four 32 MiB
        float32 chunks. A pass runs the LM head at the answer tokens only (train/batch.py:
        `Padded.scored`), not at the messages between a packed session's answers, so a pass's
        logits are [answer tokens, V]. A thinking answer can still fill its sample, so
        `TrainerNeed.need` counts the whole pass as answers: at 16,384 tokens and Qwen3's 151,936-row
        vocabulary 9.3 GiB, where a 512-token answer alone keeps 0.3 GiB."""
        return 2 * positions * self.vocab * 2 + 4 * (32 << 20)


@dataclass(frozen=True)
class TrainerNeed:
    """What the trainer beside the server will hold (its config, resolved)."""

    weights: Literal["lora", "full"]
    tokens: int  # its longest pass: max(micro_batch_tokens, max_seq_len)
    lora_rank: int = 16
    reference: bool = True  # full fine-tuning keeps a bf16 copy of the base (KL, the canary)
    shards: int = 1  # FSDP ranks sharing the weights and optimizer state
    device: str | None = None  # train.device as configured (None: this module decides)
    share: float | None = None  # train.gpu_share as configured

    def need(self, shape: Shape, params: int) -> int:
        """Bytes, per rank (docs/scale.md's memory table)."""
        lora = self.weights == "lora"
        # bf16 base | float32 master, its gradient, AdamW's moments (fused: no temporary), the bf16
        # weights and reference: 0.97 of one H200's peak at 4B with 513 positions' logits (bench/gpu_full.py)
        per_param = 2 if lora else 16 + 2 + (2 if self.reference else 0)
        state = per_param * params + (16 * shape.lora_params(self.lora_rank) if lora else 0)
        return (
            state // self.shards + shape.activation_bytes(self.tokens, lora) + shape.logits_bytes(self.tokens)
        )


@dataclass(frozen=True)
class Server:
    """What the server will hold (its config, resolved)."""

    gpu: int  # its GPU's index (model.device)
    window: int  # tokens served
    share: float | None = None  # engine.gpu_share as configured
    prefix_cache_bytes: int | None = None  # engine.prefix_cache_mb as configured (the local engine)
    adapter_params: int = 0  # one shared LoRA adapter's: served in float32, two during a swap
    # An adapter per user, or vLLM: the slots preallocated on the GPU (model/adapter_slots.py), and
    # the adapters kept in pinned host memory (vLLM's CPU cache), outside any GPU share.
    adapter_bytes: int = 0
    adapter_host_bytes: int = 0
    adapter_slots: int = 0  # how many slots adapter_bytes holds

    def floor(self, weights: int, kv_per_token: int) -> int:
        """The least it can serve in: weights, adapters, one window's KV, the workspace, the context."""
        return (
            weights
            + 8 * self.adapter_params
            + self.adapter_bytes
            + self.window * kv_per_token
            + SERVER_WORKSPACE
            + PROCESS_OVERHEAD
        )


@dataclass(frozen=True)
class Budget:
    """The layout decided at start; shares are fractions of their GPU's total memory."""

    server_gpu: int
    server_share: float
    gpu_bytes: tuple[int, ...]  # every visible GPU's total memory, by index
    weights_bytes: int  # the served weights
    kv_per_token: int  # bytes of KV a token, every layer
    window_kv_bytes: int  # one full window's KV
    server_floor: int  # the least the server can serve in (Server.floor)
    trainer_gpu: int | None = None  # None: no trainer beside this server
    trainer_share: float | None = None
    trainer_bytes: int | None = None  # the trainer's need by the arithmetic, before the margin
    kv_bytes: int = 0  # what the server's share leaves for KV (the local engine: prefix cache and batch)
    prefix_cache_bytes: int = 0  # the local engine: of kv_bytes, the prefix cache's part
    train_seq_len: int | None = None  # the trainer's longest sample, where the served window did not fit
    # A group of ranks (placement.py), by rank: each one's GPU and share. trainer_gpu and
    # trainer_share are then the rank's beside the server, else rank 0's.
    rank_gpus: tuple[int, ...] = ()
    rank_shares: tuple[float, ...] = ()

    @property
    def batch_kv_bytes(self) -> int:
        """The local engine's running batch: the KV it may hold, padded rows included."""
        return self.kv_bytes - self.prefix_cache_bytes

    @property
    def server_bytes(self) -> int:
        return int(self.server_share * self.gpu_bytes[self.server_gpu])

    def summary(self) -> str:
        """One log line: who takes what."""
        s = (
            f"GPU {self.server_gpu} ({_gib(self.gpu_bytes[self.server_gpu])} GiB): the server takes "
            f"{self.server_share:.2f} (weights {_gib(self.weights_bytes)} GiB, KV {_gib(self.kv_bytes)} GiB)"
        )
        if self.trainer_gpu is not None and self.trainer_share is not None and self.trainer_bytes is not None:
            where = "the same GPU" if self.trainer_gpu == self.server_gpu else f"GPU {self.trainer_gpu}"
            s += (
                f"; the trainer {self.trainer_share:.2f} of {where} "
                f"(its arithmetic: {_gib(self.trainer_bytes)} GiB)"
            )
        return s


def allocator_fraction(share: float, gpu_bytes: int) -> float:
    """The cap a torch process sets on its caching allocator for a `share` of a GPU of `gpu_bytes`:
    the share less its CUDA context, which lies outside the allocator."""
    return max(0.01, share - PROCESS_OVERHEAD / gpu_bytes)


def plan(
    shape: Shape,
    params: int,
    gpus: tuple[int, ...],
    server: Server,
    trainer: TrainerNeed | None,
    dtype_bytes: int = 2,
) -> Budget:
    """The layout of a server (and a trainer beside it) on `gpus` (each one's total bytes, by
    index); BudgetRefused with the numbers when it cannot fit (the module docstring)."""
    if not 0 <= server.gpu < len(gpus):
        raise BudgetRefused(f"model.device names GPU {server.gpu}, but {len(gpus)} are visible")
    weights, kv = dtype_bytes * params, shape.kv_bytes_per_token(dtype_bytes)
    b = Budget(
        server_gpu=server.gpu,
        server_share=server.share or ALONE_SHARE,
        gpu_bytes=tuple(gpus),
        weights_bytes=weights,
        kv_per_token=kv,
        window_kv_bytes=server.window * kv,
        server_floor=server.floor(weights, kv),
    )
    if trainer is not None:
        b = _with_trainer(
            b=b, server=server, trainer=trainer, need=trainer.need(shape, params), params=params
        )
    problems = _problems(b)
    if not problems:
        b, problems = _local_kv(b, server.prefix_cache_bytes)
    if problems:
        raise BudgetRefused(_refusal(b, params, trainer, problems))
    return b


def _with_trainer(b: Budget, server: Server, trainer: TrainerNeed, need: int, params: int) -> Budget:
    """A GPU each (the trainer's share ALONE_SHARE unless configured), or one GPU for both: the
    trainer its need with the margin (or its configured share), the server the rest."""
    where = _trainer_gpu(trainer, server.gpu, len(b.gpu_bytes), params)
    if where != server.gpu:
        return replace(b, trainer_gpu=where, trainer_share=trainer.share or ALONE_SHARE, trainer_bytes=need)
    wanted = _ceil((need * TRAINER_MARGIN + PROCESS_OVERHEAD) / b.gpu_bytes[where])
    share = trainer.share or wanted
    server_share = server.share or max(0.0, _floor(1 - share - SLACK))
    return replace(b, server_share=server_share, trainer_gpu=where, trainer_share=share, trainer_bytes=need)


def _trainer_gpu(trainer: TrainerNeed, server_gpu: int, count: int, params: int) -> int:
    if trainer.device is not None:
        name, _, index = trainer.device.partition(":")
        if name != "cuda" or not (index or "0").isdigit():
            raise BudgetRefused(f"train.device {trainer.device!r}: name a GPU as 'cuda' or 'cuda:N'")
        if int(index or 0) >= count:
            raise BudgetRefused(f"train.device {trainer.device!r}, but {count} GPUs are visible")
        return int(index or 0)
    if count >= 2 and params >= SPLIT_FROM and trainer.shards == 1:
        return next(i for i in range(count) if i != server_gpu)
    return server_gpu  # a group of ranks is placed rank by rank (placement.py), each with its device


def _problems(b: Budget) -> list[str]:
    shared = b.trainer_gpu == b.server_gpu and b.trainer_share is not None
    if shared and b.trainer_share is not None and b.trainer_share > 1 - SLACK:
        return [f"the trainer alone asks {b.trainer_share:.2f} of the GPU"]
    problems = []
    if b.server_floor > b.server_bytes:
        leaves = f" (what the trainer's {b.trainer_share:.2f} leaves)" if shared else ""
        problems.append(
            f"the server needs at least {_gib(b.server_floor)} GiB, its share "
            f"{b.server_share:.2f}{leaves} is {_gib(b.server_bytes)} GiB"
        )
    if b.trainer_gpu is not None and b.trainer_share is not None and b.trainer_bytes is not None:
        has = b.trainer_share * b.gpu_bytes[b.trainer_gpu]
        if b.trainer_bytes + PROCESS_OVERHEAD > has:
            problems.append(
                f"the trainer needs about {_gib(b.trainer_bytes + PROCESS_OVERHEAD)} GiB, its "
                f"share {b.trainer_share:.2f} is {_gib(has)} GiB"
            )
        if shared and b.server_share + b.trainer_share > 1 + 1e-9:
            problems.append(
                f"the two shares add up to {b.server_share + b.trainer_share:.2f} of one GPU "
                f"(the server's {b.server_share:.2f}: engine.gpu_share, the trainer's "
                f"{b.trainer_share:.2f}: train.gpu_share), more than 1"
            )
    return problems


def _local_kv(b: Budget, prefix_cache: int | None) -> tuple[Budget, list[str]]:
    """What the server's share leaves for KV once its weights, workspace and context are in; a
    quarter of it for the prefix cache (or the configured size), never so much that the running
    batch cannot hold one window."""
    room = b.server_bytes - (b.server_floor - b.window_kv_bytes)
    prefix = max(0, min(room // 4, room - b.window_kv_bytes)) if prefix_cache is None else prefix_cache
    b = replace(b, kv_bytes=room, prefix_cache_bytes=prefix)
    if prefix_cache is not None and room - prefix < b.window_kv_bytes:
        return b, [
            f"engine.prefix-cache-mb {prefix >> 20} leaves the running batch {_gib(room - prefix)} GiB "
            f"of the {_gib(room)} GiB of KV the share has, less than one window"
        ]
    return b, []


def _refusal(b: Budget, params: int, trainer: TrainerNeed | None, problems: list[str]) -> str:
    text = (
        f"the model does not fit GPU {b.server_gpu} ({_gib(b.gpu_bytes[b.server_gpu])} GiB): "
        f"{params / 1e9:.2f}B parameters, weights {_gib(b.weights_bytes)} GiB, KV "
        f"{b.kv_per_token // 1024} KiB a token ({_gib(b.window_kv_bytes)} GiB for one window)"
    )
    if trainer is not None and b.trainer_bytes is not None:
        kind = "LoRA" if trainer.weights == "lora" else "full fine-tuning"
        text += (
            f", a {kind} trainer on {trainer.tokens:,}-token passes: about {_gib(b.trainer_bytes)} GiB "
            f"(its share asks {TRAINER_MARGIN:g}x that, plus its CUDA context)"
        )
    fixes = ["a shorter --model.max-context", "other --engine.gpu-share / --train.gpu-share"]
    if trainer is not None:
        fixes += ["--train.max-seq-len 16384", "the trainer on a GPU of its own (--train.device cuda:1)"]
        if trainer.weights == "full":
            fixes += ["--train.weights lora"]
        fixes += ["FSDP over several GPUs with --train.enabled false here (docs/scale.md)"]
    return f"{text}; {'; '.join(problems)}. What can fit: {', '.join(fixes)}."


def _ceil(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


def _floor(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"
