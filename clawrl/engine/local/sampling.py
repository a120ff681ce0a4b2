"""Token sampling for a batch of rows, each with its own parameters.

For row i with temperature T_i > 0:
    l_i    = the row's logits after its repetition penalties (`penalties.py`; none: the logits)
    q_i    = softmax(l_i / T_i) restricted to the top-k tokens, then to the top-p nucleus,
             renormalised
    token  = argmax_v q_i[v] / E_v,  E_v ~ Exp(1)           (an exact draw from q_i)
    logp   = log q_i[token]                                 (recorded: the behaviour logprob)
For T_i == 0 the token is argmax(l_i) and logp = log_softmax(l_i)[token].

The exponential race samples every row in one vectorised argmax; a seeded
request draws its noise from its own generator, so its tokens do not depend on
which other requests share the batch.

The recorded logprob ignores the top-k and top-p truncations and the repetition penalties
(`penalties.py`: they shape q_i only) on purpose: the trainer can recompute
log_softmax(logits / T) from logits alone, not the nucleus or a row's history. (top_k <= 0: no
top-k cut, as vLLM's -1.) A row decoded under a grammar comes with its logits already masked
to -inf outside the allowed tokens (`clawrl/model/constrain.py`), so all of the above is of
the masked distribution; the trainer rebuilds the same mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from clawrl.engine.local.penalties import NO_PENALTIES, Penalties, PenaltyState

MASKED_LOGPROB = -9999.0  # how a top logprob of a token masked out by a grammar is shown


@dataclass
class RowSampler:
    """Per-row sampling state: parameters plus a generator when seeded."""

    temperature: float
    top_p: float
    top_logprobs: int
    generator: torch.Generator | None
    top_k: int = 0
    penalty: PenaltyState | None = None  # None: no repetition penalty

    @classmethod
    def create(
        cls,
        temperature: float,
        top_p: float,
        top_logprobs: int,
        seed: int | None,
        device: str | torch.device = "cpu",
        top_k: int = 0,
        penalties: Penalties = NO_PENALTIES,
        prompt_ids: Sequence[int] = (),
    ) -> RowSampler:
        generator = None
        if seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed)
        penalty = PenaltyState(penalties, prompt_ids) if penalties.active else None
        return cls(
            temperature=temperature,
            top_p=top_p,
            top_logprobs=top_logprobs,
            generator=generator,
            top_k=top_k,
            penalty=penalty,
        )


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
    chosen, drawn = _choose(_penalised(logits, logprobs, temps, rows), rows)
    picked = drawn.tolist()
    ids = chosen.tolist()
    for row, token in zip(rows, ids, strict=True):
        if row.penalty is not None:
            row.penalty.observe(token)
    k = max(r.top_logprobs for r in rows)
    tops = _top(logprobs, k) if k else [[] for _ in rows]
    return [Sampled(ids[i], picked[i], tuple(tops[i][: rows[i].top_logprobs])) for i in range(len(rows))]


def _penalised(
    logits: torch.Tensor, logprobs: torch.Tensor, temps: torch.Tensor, rows: list[RowSampler]
) -> torch.Tensor:
    """The log-distribution each row draws from: `logprobs`, or the penalised logits' where a row
    has repetition penalties."""
    if all(r.penalty is None for r in rows):
        return logprobs
    shaped = logits.clone()
    for i, row in enumerate(rows):
        if row.penalty is not None:
            shaped[i] = row.penalty.apply(logits[i])
    return torch.log_softmax(shaped / temps[:, None], dim=-1)


def _choose(logprobs: torch.Tensor, rows: list[RowSampler]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token [B] and its log-probability under the distribution it was drawn from [B]."""
    chosen = logprobs.argmax(dim=-1)
    drawn = logprobs.gather(1, chosen[:, None]).squeeze(1)
    hot = [i for i, r in enumerate(rows) if r.temperature > 0]
    if not hot:
        return chosen, drawn
    probs = logprobs[hot].exp()  # [S, V]
    for j, i in enumerate(hot):
        if 0 < rows[i].top_k < probs.shape[-1]:
            probs[j] = _top_k(probs[j], rows[i].top_k)
        if rows[i].top_p < 1.0:
            probs[j] = _nucleus(probs[j], rows[i].top_p)
    # Exp(1) noise as -log(U): torch's exponential_ is ~6x slower than rand on CPU.
    uniform = torch.empty_like(probs)
    if all(rows[i].generator is None for i in hot):
        uniform.uniform_()
    else:
        for j, i in enumerate(hot):
            uniform[j].uniform_(generator=rows[i].generator)
    picks = (probs / -uniform.log()).argmax(dim=-1)
    chosen[hot] = picks
    # log q[token]: the truncated distribution, renormalised (its mass is 1 when nothing was cut).
    drawn[hot] = (probs.gather(1, picks[:, None]).squeeze(1) / probs.sum(-1)).log()
    return chosen, drawn


def _top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Zero out every token outside the k most likely (ties at the k-th are kept)."""
    kth = probs.topk(k).values[-1]
    return probs.masked_fill(probs < kth, 0.0)


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
    # A token a grammar masks out has logprob -inf, which JSON cannot carry: vLLM's -9999 instead.
    values, indices = logprobs.topk(k, dim=-1)
    values = values.clamp(min=MASKED_LOGPROB)
    return [list(zip(ix, vs, strict=True)) for ix, vs in zip(indices.tolist(), values.tolist(), strict=True)]


def score_tokens(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target] per position. logits [N, V], targets [N] -> [N]."""
    t = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits.float() / t, dim=-1)
    return logprobs.gather(1, targets[:, None]).squeeze(1)
