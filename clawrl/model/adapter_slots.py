"""How many LoRA adapters the server holds, and where: the slots it preallocates on the device and
the adapters it keeps in host memory. Pure arithmetic on the config and the model's shape.

vLLM preallocates `--max-loras` slots at `--max-lora-rank` for every projection it can adapt
(`budget.TARGETS`), in the model's dtype, when it starts: 66 MB a slot at Qwen3-4B's shape, 87 MB at
8B's (rank 16, bf16). A slot per user would make 100 users 8.8 GB at 8B, which nothing counted.
A batch only needs a slot per adapter decoding in it, so with an adapter per user
`--max-loras` is every served user's adapter and one for a swap's moment, capped at `LORA_SLOTS`;
the other users' adapters wait in vLLM's CPU cache (`--max-cpu-loras`: every user's, pinned host
memory) and are copied into a free slot when their user's request is scheduled (a request beyond
`LORA_SLOTS` distinct users in one step waits a step, it is not refused).

The local engine (an adapter per user, `engine/local/stack.py`) preallocates a slot per served user
and slot 0 (the base) at `train.lora.rank`, over the trainer's targets, in the serving dtype; with
one shared adapter it keeps the served one in float32 and a second during a swap
(`budget.Server.adapter_params`).
"""

from __future__ import annotations

from dataclasses import dataclass

from clawrl.config import Config
from clawrl.model.budget import TARGETS, Shape

LORA_SLOTS = 16  # adapters vLLM decodes in one batch by default: the local engine's batch, 16 rows


def vllm_max_loras(config: Config) -> int:
    """vLLM's --max-loras: `engine.vllm.max_loras` where set; else, with an adapter per user, every
    served user's adapter (the users file's and the default user's) and one for a swap, at most
    LORA_SLOTS; else 2 (the served adapter and the next during a swap)."""
    if config.engine.vllm.max_loras is not None:
        return config.engine.vllm.max_loras
    if not config.per_user_adapters:
        return 2
    return min(len(config.server.user_names) + 1, LORA_SLOTS)


def vllm_max_cpu_loras(config: Config) -> int:
    """vLLM's --max-cpu-loras: every served user's adapter and one for a swap, so a user whose
    adapter left its device slot gets it back from host memory, not from disk; never below
    --max-loras (vLLM refuses that)."""
    users = len(config.server.user_names) + 1 if config.per_user_adapters else 2
    return max(users, vllm_max_loras(config))


def local_slots(config: Config) -> int:
    """The local engine's preallocated slots with an adapter per user: slot 0 (the base) and one
    for each served user (a user beyond them, from a users file read again, grows the stack)."""
    return len(config.server.user_names) + 1


@dataclass(frozen=True)
class AdapterMemory:
    """What the server holds for adapters: `device` bytes on its GPU (counted in its share) and
    `host` bytes of pinned host memory (vLLM's CPU cache)."""

    slots: int
    host_adapters: int
    slot_bytes: int
    shared_params: int = 0  # one shared adapter on the local engine: budget.Server.adapter_params

    @property
    def device(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def host(self) -> int:
        return self.host_adapters * self.slot_bytes


def adapter_memory(config: Config, shape: Shape, engine: str, dtype_bytes: int) -> AdapterMemory:
    """The server's adapters under `config` on a model of `shape` served in `dtype_bytes`, for
    `engine` "vllm" or "local"; nothing for full fine-tuning."""
    if config.train.weights != "lora":
        return AdapterMemory(0, 0, 0)
    if engine == "vllm":
        slot = shape.lora_params(config.engine.vllm.max_lora_rank, TARGETS) * dtype_bytes
        return AdapterMemory(vllm_max_loras(config), vllm_max_cpu_loras(config), slot)
    lora = config.train.lora
    params = shape.lora_params(lora.rank, tuple(lora.targets))
    if not config.per_user_adapters:
        return AdapterMemory(0, 0, 0, shared_params=params)
    return AdapterMemory(local_slots(config), 0, params * dtype_bytes)
