"""Repetition penalties for one row, with vLLM's (and OpenAI's) meaning.

For the logits l of the next token, with P the prompt's tokens and O the tokens generated so far
(c_v: how often token v is in O):

    repetition r (vLLM, HF):  l_v / r if l_v > 0 else l_v * r,   for v in P ∪ O   (1: off)
    frequency f (OpenAI):      l_v - f * c_v                                         (0: off)
    presence p (OpenAI):       l_v - p * [c_v > 0]                                   (0: off)

They shape which token is drawn, and so the logprob recorded for it: like the top-k and top-p
cuts, the recorded logprob is of the penalised distribution the token was drawn from (the
behaviour mu of the trainer's importance weight; clawrl/engine/local/sampling.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.frequency != 0.0 or self.presence != 0.0


NO_PENALTIES = Penalties()


class PenaltyState:
    """The tokens one row has seen: its prompt's and the ones it drew, counted."""

    def __init__(self, penalties: Penalties, prompt_ids: Sequence[int]) -> None:
        self.penalties = penalties
        self._prompt = list(prompt_ids) if penalties.repetition != 1.0 else []
        self._seen: torch.Tensor | None = None  # [V] bool: in the prompt or drawn
        self._counts: torch.Tensor | None = None  # [V] float: times drawn

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [V] (float) with the penalties applied, as a new tensor."""
        return penalise(logits[None], [self])[0]

    def tensors(self, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens seen [V] (bool) and the times each was drawn [V] (float), made at first use."""
        if self._counts is None or self._seen is None:
            self._counts = torch.zeros(vocab, device=device)
            self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            ids = torch.tensor([i for i in self._prompt if 0 <= i < vocab], dtype=torch.long)
            self._seen[ids.to(device)] = True
        return self._seen, self._counts

    def observe(self, token_id: int) -> None:
        """Count a drawn token."""
        if self._counts is not None and 0 <= token_id < self._counts.shape[0]:
            self._counts[token_id] += 1
            self._seen[token_id] = True


def penalise(logits: torch.Tensor, states: Sequence[PenaltyState]) -> torch.Tensor:
    """`logits` [P, V] (float) with row i's penalties (`states[i]`) applied, the batch at once, as a
    new tensor. A penalty that is off is a no-op on its row (r = 1 scales nothing, f = p = 0 subtract 0)."""
    vocab, device = logits.shape[-1], logits.device
    seen, counts = (torch.stack(t) for t in zip(*(s.tensors(vocab, device) for s in states), strict=True))

    def column(name: str) -> torch.Tensor:  # [P, 1]: one figure a row
        return torch.tensor([getattr(s.penalties, name) for s in states], device=device)[:, None]

    r, f, p = column("repetition"), column("frequency"), column("presence")
    out = logits
    if bool((r != 1.0).any()):
        scaled = torch.where(out > 0, out / r, out * r)
        # A tiny r (the API takes any r > 0) overflows l / r: the largest finite logit instead, so
        # the distribution stays defined (all its mass on the seen tokens) and every logprob finite.
        scaled = scaled.clamp(max=torch.finfo(scaled.dtype).max)
        out = torch.where(seen & (r != 1.0), scaled, out)
    if bool((f != 0.0).any()):
        out = out - f * counts
    if bool((p != 0.0).any()):
        out = out - p * (counts > 0).float()
    return out
