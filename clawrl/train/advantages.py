"""Per-token advantages A_t of each sample kind (docs/design.md, "Methods"); pure functions.

    rl:   A_t = w_rl * r                                     r in {-1, 0, +1}, the same for every token
    opd:  A_t = w_opd * (teacher_logp_t - old_logp_t)        teacher_logp = logp(a_t | s + hint)

old_logp is the behaviour logprob recorded at serving; teacher_logp scores
the same response tokens after the enhanced prompt (by default with the live
policy at update time). Both are constants here: the result is detached.

Combine. DESIGN's combined advantage is

    A_t = w_rl * r + w_opd * (teacher_logp_t - old_logp_t)

and the combine method gives one turn an `rl` sample (when r != 0) and an
`opd` sample (when a hint was accepted), each with its own kind's term above.
Both samples hold the same tokens, old_logp and hence the same rho_t, so
inside the trust region their two surrogate terms sum to rho_t * A_t with
DESIGN's A_t: the sum over the batch is the combined objective. Where a term
is missing (r = 0, or no hint) it is zero in DESIGN's formula too. Deviations:
clipping applies to each term on its own (min(rho*a) + min(rho*b) differs from
min(rho*(a+b)) when a and b have opposite signs and rho is outside the region),
and the token-level mean counts such a turn's tokens twice, once per sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from clawrl.types import Sample


def advantages(
    kind: str,
    reward: float,
    old_logp: Tensor,
    teacher_logp: Tensor | None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
) -> Tensor:
    """A_t [T] for one sample of `kind` (`rl` or `opd`) with behaviour logprobs old_logp [T]."""
    old = old_logp.detach()
    if kind == "rl":
        return torch.full_like(old, w_rl * float(reward))
    if kind == "opd":
        if teacher_logp is None:
            raise ValueError("an opd sample needs teacher_logp")
        if teacher_logp.shape != old.shape:
            raise ValueError(f"teacher_logp {tuple(teacher_logp.shape)} != old_logp {tuple(old.shape)}")
        return w_opd * (teacher_logp.detach().to(old.dtype) - old)
    raise ValueError(f"unknown sample kind {kind!r}; known kinds: rl, opd")


def batch_advantages(
    samples: Sequence[Sample],
    old: Tensor,
    teacher: Tensor | None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
) -> Tensor:
    """A [B, T] for a right-padded batch; zero past each sample's response.

    old [B, T]: the samples' behaviour logprobs, padded; teacher [B, T]: the
    teacher logprobs of the same tokens (rows of `rl` samples are ignored and
    may hold anything), or None when the batch has no `opd` sample.
    """
    if old.dim() != 2 or old.shape[0] != len(samples):
        raise ValueError(f"old must be [B={len(samples)}, T], got shape {tuple(old.shape)}")
    if teacher is not None and teacher.shape != old.shape:
        raise ValueError(f"teacher {tuple(teacher.shape)} != old {tuple(old.shape)}")
    out = torch.zeros_like(old.detach())
    for i, sample in enumerate(samples):
        n = len(sample.response_ids)
        if n > old.shape[1]:
            raise ValueError(f"sample {i} has {n} response tokens, the batch only {old.shape[1]}")
        row_teacher = None if teacher is None else teacher[i, :n]
        out[i, :n] = advantages(sample.kind, sample.reward, old[i, :n], row_teacher, w_rl, w_opd)
    return out
