"""What bench/gpu.py and its trainer process (bench/gpu_workload.py) share: the run's lengths,
random prompts, the training samples and the memory figure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Scale:
    """Lengths and stream counts of one run."""

    streams: tuple[int, ...]
    decode_prompt: int
    decode_tokens: int
    prefill: int
    train_seq: int  # tokens of each training sample (prompt, or hinted prompt, + response)
    train_response: int
    train_samples: int = 8
    hint: int = 24  # tokens the hint adds to an opd sample's teacher prompt
    kl_turns: int = 8  # recorded turns the canary's KL reads (guard.kl_turns)
    long_prompt: int = 13000  # the longest prompt of the long-prompt decode (bench/gpu_workload.py)
    long_streams: int = 8  # its streams, one of `streams`


def random_ids(n: int, vocab: int, gen: Any) -> list[int]:
    import torch

    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def train_samples(scale: Scale, vocab: int, ids: Any) -> list[Any]:
    """Half `rl` (reward +-1), half `opd` (a hinted teacher prompt), every sequence train_seq long;
    behaviour logprobs near a random model's, -log(vocab)."""
    from clawrl.types import Sample

    r = scale.train_response
    out = []
    for i in range(scale.train_samples):
        opd = i % 2 == 1
        prompt = ids(scale.train_seq - r - (scale.hint if opd else 0))
        teacher = prompt + ids(scale.hint) if opd else None
        reward = 0.0 if opd else (1.0 if i % 4 == 0 else -1.0)
        kind = "opd" if opd else "rl"
        logprobs = [-math.log(vocab)] * r
        out.append(
            Sample(f"t{i}", kind, prompt, ids(r), logprobs, "v0", 1.0, reward, teacher_prompt_ids=teacher)
        )
    return out


def memory_mb(device: str, peak: bool) -> float:
    import torch

    if device == "cuda":
        return (torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()) / 2**20
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over an exec, so a child process
    # started from a large one (bench/gpu_workload.py's trainer) would report its parent's peak.
    key = "VmHWM:" if peak else "VmRSS:"
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith(key)) / 1024
