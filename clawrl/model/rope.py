"""RoPE scaled only where it is needed: the model's own while a sequence fits the window it was
trained on, YaRN past it (as Qwen advises for static YaRN).

Static scaling changes every position, also those inside the trained window, and a small
model under a long agent prompt pays for it (the embedded model, greedy, behind OpenClaw's
prompt: 5 of 20 everyday questions right with YaRN x4 against 16 of 20 unscaled). So a model
served past its trained window keeps both rotary tables, and each sequence uses one of them
for all of its positions (`WindowedRope`):

- the local engine decides per request when it is admitted: scaled iff prompt + max_tokens
  passes the trained window, so a sequence that might cross the window is scaled from its
  first token and its KV cache never mixes the two; the choice is recorded on the turn and
  its samples (`Turn.rope_scaled`), and the prefix cache is keyed by it;
- the trainer scores each sample with its recorded choice; everything else (a `score` call,
  the canary, replay, a sample recorded before the choice was) decides by its own length;
- a conversation that grows past the window: each turn decides for itself; the first turn
  whose prompt + max_tokens passes the window is served scaled, from a prefix cache entry of
  its own kind (the unscaled turns' KV is not reused for it).

The vLLM engine serves the model's own window unscaled, so its turns are recorded unscaled.
`model.scale_rope = "always"` keeps the static scaling of every position (the choice before).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class WindowedRope(nn.Module):
    """The model's rotary embedding, unscaled or scaled per sequence (see the module docstring).

    `rows`: per batch row, True for the scaled table, False for the model's own, None for
    "by its length" (scaled iff a position reaches `trained`); unset (None) means every row
    by its length. Set it with `rope_rows` around a forward.
    """

    def __init__(self, scaled: nn.Module, unscaled: nn.Module, trained: int) -> None:
        super().__init__()
        self.scaled, self.unscaled, self.trained = scaled, unscaled, trained
        self.rows: Sequence[bool | None] | None = None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flags = self._flags(position_ids)
        if not bool(flags.any()):
            return self.unscaled(x, position_ids)
        if bool(flags.all()):
            return self.scaled(x, position_ids)
        cos_s, sin_s = self.scaled(x, position_ids)
        cos_u, sin_u = self.unscaled(x, position_ids)
        pick = flags.view(-1, 1, 1)
        return torch.where(pick, cos_s, cos_u), torch.where(pick, sin_s, sin_u)

    def _flags(self, position_ids: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        if rows is not None and None not in rows:  # every row's choice given: nothing to measure
            return torch.tensor(rows, dtype=torch.bool, device=position_ids.device)
        long = position_ids.max(dim=-1).values >= self.trained  # [B] (or [1]): by length
        if rows is None:
            return long
        given = [bool(long[min(i, len(long) - 1)]) if r is None else r for i, r in enumerate(rows)]
        return torch.tensor(given, dtype=torch.bool, device=position_ids.device)


def install(model: nn.Module, unscaled_config: Any, trained: int) -> WindowedRope | None:
    """Give `model` (built with a scaled config) a `WindowedRope`; None if it has no rotary
    module where Llama-family models keep one (`model.model.rotary_emb`)."""
    inner = getattr(model, "model", None)
    scaled = getattr(inner, "rotary_emb", None)
    if scaled is None:
        return None
    unscaled = type(scaled)(config=copy.deepcopy(unscaled_config))
    rope = WindowedRope(scaled, unscaled.to(next(scaled.buffers()).device), trained)
    inner.rotary_emb = rope
    return rope


def find(model: nn.Module) -> WindowedRope | None:
    """The model's `WindowedRope` (also inside a PEFT or DDP wrapper), or None."""
    return next((m for m in model.modules() if isinstance(m, WindowedRope)), None)


@contextmanager
def rope_rows(model: nn.Module | WindowedRope | None, rows: Sequence[bool | None] | None) -> Iterator[None]:
    """Forwards inside use `rows` (per batch row: scaled, unscaled, or None: by length)."""
    rope = model if isinstance(model, WindowedRope) or model is None else find(model)
    if rope is None:
        yield
        return
    before, rope.rows = rope.rows, rows
    try:
        yield
    finally:
        rope.rows = before
