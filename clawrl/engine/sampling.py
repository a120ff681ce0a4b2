"""Token sampling for a batch of rows, each with its own parameters.

For row i with temperature T_i > 0:
    logp_i = log_softmax(logits_i / T_i)                    (recorded logprob, full vocab)
    q_i    = softmax(logits_i / T_i) restricted to the top-p nucleus, renormalised
    token  ~ q_i                                            (the row's own torch.Generator)
For T_i == 0 the token is argmax(logits_i) and logp_i = log_softmax(logits_i).

The recorded logprob ignores the top-p truncation on purpose: the trainer can
recompute log_softmax(logits / T) from logits alone, not the nucleus.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampler:
    """Per-row sampling state: parameters plus a generator when seeded."""

    temperature: float
    top_p: float
    top_logprobs: int
    generator: torch.Generator | None

    @classmethod
    def create(cls, temperature: float, top_p: float, top_logprobs: int, seed: int | None) -> RowSampler:
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        return cls(temperature, top_p, top_logprobs, generator)


@dataclass
class Sampled:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def sample_rows(logits: torch.Tensor, rows: list[RowSampler]) -> list[Sampled]:
    """Sample one token per row of `logits` [B, V] (any dtype/device)."""
    logits = logits.float()
    temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], device=logits.device)
    logprobs = torch.log_softmax(logits / temps[:, None], dim=-1)  # [B, V]
    chosen = _choose(logprobs, rows)
    picked = logprobs.gather(1, chosen[:, None]).squeeze(1).tolist()
    ids = chosen.tolist()
    k = max(r.top_logprobs for r in rows)
    tops = _top(logprobs, k) if k else [[] for _ in rows]
    return [Sampled(ids[i], picked[i], tuple(tops[i][: rows[i].top_logprobs])) for i in range(len(rows))]


def _choose(logprobs: torch.Tensor, rows: list[RowSampler]) -> torch.Tensor:
    greedy = logprobs.argmax(dim=-1)
    if all(r.temperature <= 0 for r in rows):
        return greedy
    out = greedy.clone()
    for i, row in enumerate(rows):
        if row.temperature > 0:
            probs = _nucleus(logprobs[i].exp(), row.top_p)
            # multinomial on CPU keeps seeded generators device-independent.
            out[i] = torch.multinomial(probs.cpu(), 1, generator=row.generator).item()
    return out


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out the tail outside the smallest set whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly before each token
    cut = before >= top_p
    cut[0] = False  # the most likely token always stays, so top_p=0 is greedy
    sorted_probs[cut] = 0.0
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs)


def _top(logprobs: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    values, indices = logprobs.topk(k, dim=-1)
    return [list(zip(ix, vs, strict=True)) for ix, vs in zip(indices.tolist(), values.tolist(), strict=True)]


def score_tokens(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target] per position. logits [N, V], targets [N] -> [N]."""
    t = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits.float() / t, dim=-1)
    return logprobs.gather(1, targets[:, None]).squeeze(1)
