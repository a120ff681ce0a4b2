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
which other requests share the batch. The penalties, the top-k and the top-p cuts are
applied to the whole batch at once (each row its own k, p and penalties: a row without a
cut gets a threshold that cuts nothing), never row by row in Python: the same masks and
probabilities as one row at a time (tests/unit/test_sampling.py keeps that version to check).

The recorded logprob ignores the top-k and top-p truncations and the repetition penalties
(`penalties.py`: they shape q_i only) on purpose: the trainer can recompute
log_softmax(logits / T) from logits alone, not the nucleus or a row's history. (top_k <= 0: no
top-k cut, as vLLM's -1.) A row decoded under a grammar comes with its logits already masked
to -inf outside the allowed tokens (`clawrl/model/constrain.py`), so all of the above is of
the masked distribution; the trainer rebuilds the same mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from clawrl.engine.local.penalties import NO_PENALTIES, Penalties, PenaltyState, penalise

MASKED_LOGPROB = -9999.0  # how a top logprob of a token masked out by a grammar is shown
# exp of a log-probability below this is a subnormal float (< 1.2e-38), which a CPU computes (and
# every later op on it: topk, division, argmax) tens of times slower; at T 0.2 most of a row is
# there. Such a probability is taken as 0: a mass no draw could pick.
SUBNORMAL_LOGPROB = math.log(torch.finfo(torch.float32).tiny)


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
    # log_softmax(logits / T) [B, V]: the draw's where a row has no penalty, the top logprobs'. Not
    # computed where neither needs it (every row penalised, as under the model's own defaults).
    needed = not rows or any(r.penalty is None or r.top_logprobs for r in rows)
    logprobs = torch.log_softmax(logits / temps[:, None], dim=-1) if needed else None
    chosen, drawn = _choose(_penalised(logits, logprobs, temps, rows), rows)
    picked = drawn.tolist()
    ids = chosen.tolist()
    for row, token in zip(rows, ids, strict=True):
        if row.penalty is not None:
            row.penalty.observe(token)
    k = max(r.top_logprobs for r in rows)
    tops = _top(logprobs, k) if k and logprobs is not None else [[] for _ in rows]
    return [Sampled(ids[i], picked[i], tuple(tops[i][: rows[i].top_logprobs])) for i in range(len(rows))]


def _penalised(
    logits: torch.Tensor, logprobs: torch.Tensor | None, temps: torch.Tensor, rows: list[RowSampler]
) -> torch.Tensor:
    """The log-distribution each row draws from: `logprobs` (None only where every row is
    penalised), or the penalised logits' where a row has repetition penalties."""
    states = [r.penalty for r in rows if r.penalty is not None]
    if states and len(states) == len(rows):  # the usual case: every row under the model's own penalties
        return torch.log_softmax(penalise(logits, states) / temps[:, None], dim=-1)
    assert logprobs is not None
    if not states:
        return logprobs
    some = torch.tensor([r.penalty is not None for r in rows], device=logits.device)
    shaped = penalise(logits[some], states) / temps[some][:, None]
    out = logprobs.clone()
    out[some] = torch.log_softmax(shaped, dim=-1)
    return out


def _choose(logprobs: torch.Tensor, rows: list[RowSampler]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token [B] and its log-probability under the distribution it was drawn from [B]."""
    chosen = logprobs.argmax(dim=-1)
    drawn = logprobs.gather(1, chosen[:, None]).squeeze(1)
    hot = [i for i, r in enumerate(rows) if r.temperature > 0]
    if not hot:
        return chosen, drawn
    hot_logprobs = logprobs[hot] if len(hot) < len(rows) else logprobs
    probs = hot_logprobs.masked_fill(hot_logprobs < SUBNORMAL_LOGPROB, float("-inf")).exp()  # [S, V]
    probs = _truncate(probs, [rows[i] for i in hot])
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


def _truncate(probs: torch.Tensor, rows: list[RowSampler]) -> torch.Tensor:
    """probs [S, V] (row j: rows[j]'s) with each row's top-k, then top-p, cut (zeros; not renormalised)."""
    vocab = probs.shape[-1]
    ks = [r.top_k if 0 < r.top_k < vocab else 0 for r in rows]
    if any(ks):
        probs = _top_k(probs, ks)
    ps = [r.top_p for r in rows]
    if min(ps) < 1.0:
        probs = _nucleus(probs, ps)
    return probs


def _top_k(probs: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """probs [S, V]: zero out every token of row j outside its ks[j] most likely (ties at the k-th
    are kept; 0: no cut)."""
    k = torch.tensor(ks, device=probs.device)[:, None]  # [S, 1]
    kth = probs.topk(max(ks), dim=-1).values.gather(1, (k - 1).clamp(min=0))  # [S, 1]: the k-th largest
    kth = kth.masked_fill(k == 0, 0.0)  # no probability is below 0: nothing cut
    return probs.masked_fill(probs < kth, 0.0)


# The most likely tokens sorted first (topk, a few ms), larger until every row's nucleus ends among
# them; past the last, the whole rows are sorted (~10x as long at a 49k vocabulary).
NUCLEUS_CANDIDATES = (64, 1024)


def _nucleus(probs: torch.Tensor, ps: list[float]) -> torch.Tensor:
    """probs [S, V]: zero out the tail of row j outside the smallest set whose mass reaches ps[j]
    (1: no cut). Tokens past a row's nucleus are all cut, so where every row's nucleus ends within the
    n most likely (NUCLEUS_CANDIDATES), those are sorted (topk) instead of the whole vocabulary."""
    top_p = torch.tensor(ps, device=probs.device)[:, None]  # [S, 1]
    top_p = top_p.masked_fill(top_p >= 1.0, float("inf"))  # before >= inf never: nothing cut
    for n in (n for n in NUCLEUS_CANDIDATES if n < probs.shape[-1]):
        head, order = probs.topk(n, dim=-1)  # sorted, descending
        before = head.cumsum(-1) - head  # mass strictly before each token
        if bool((before[:, -1:] + head[:, -1:] >= top_p).all()):  # every nucleus ends in the head
            kept = _cut(head, before, top_p)
            return torch.zeros_like(probs).scatter_(1, order, kept)
    ordered, order = probs.sort(dim=-1, descending=True)
    kept = _cut(ordered, ordered.cumsum(-1) - ordered, top_p)
    return torch.zeros_like(probs).scatter_(1, order, kept)


def _cut(ordered: torch.Tensor, before: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's probabilities in descending order [S, N], zero once the mass before reaches top_p."""
    cut = before >= top_p
    cut[:, 0] = False  # the most likely token always stays, so top_p=0 is greedy
    return ordered.masked_fill(cut, 0.0)


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
