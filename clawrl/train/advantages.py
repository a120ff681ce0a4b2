"""Per-token advantages A_t of each sample kind (docs/design.md, "Methods"); pure functions.

    rl:   A_t = w_rl * r                                         r in {-1, 0, +1}, every token
    opd:  A_t = w_rl * r + w_opd * clip(gap_t, -c, c)           gap_t = teacher_logp_t - student_logp_t

teacher_logp = logp(a_t | s + hint), the response token after the enhanced prompt;
student_logp = logp(a_t | s), the same token after the turn's own prompt. Both come
from the trainer at update time (by default the live policy, before the step's update),
not from serving: the behaviour logprob recorded by the engine would carry the
sample's staleness and every engine-vs-trainer numeric difference straight into the
advantage. The behaviour logprob is used for the PPO ratio only (train/loss.py).

c = `train.opd_clip` (1.0, as in OpenClaw-RL's combine launcher; 0: no clip): on
tokens the hint contradicts the gap reaches -5 to -20 nats, against +-1 for a
reward, and a few such tokens would set a step's direction. `GapStats` says how
the gap was distributed and how much of it the clip cut.

Combine. An `opd` sample carries the turn's reward too (0 for the `opd` method,
the PRM's vote for `combine`), so `combine` emits one sample per turn: an `opd`
sample (with its reward) when a hint was accepted, else an `rl` sample when r != 0.
Its A_t is DESIGN's combined advantage, clipped as one term inside the surrogate,
and its tokens count once in the token mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from clawrl.types import Sample


def advantages(
    kind: str,
    reward: float,
    student_logp: Tensor,
    teacher_logp: Tensor | None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float = 1.0,
    centre: Tensor | None = None,
) -> Tensor:
    """A_t [T] for one sample of `kind` (`rl` or `opd`); student_logp [T] gives the shape (and the
    opd gap's base). `centre`: a [T] mask of the tokens whose clipped gaps' mean is subtracted from
    every gap (`centred_gap`); None: the gaps as they are."""
    student = student_logp.detach()
    base = torch.full_like(student, w_rl * float(reward))
    if kind == "rl":
        return base
    if kind == "opd":
        gap = clip_gap(opd_gap(student, teacher_logp), opd_clip)
        return base + w_opd * (gap if centre is None else centred_gap(gap, centre))
    raise ValueError(f"unknown sample kind {kind!r}; known kinds: rl, opd")


def centred_gap(gap: Tensor, mask: Tensor) -> Tensor:
    """The gap less its mean over the masked tokens (`train.opd_centre`).

    On the policy's own answer the gap's expectation is -KL(policy || teacher) <= 0 at every token:
    uncentred, it pushes the sampled tokens down on the whole, as a -1 reward does, and spread issue
    53's policies (answer entropy 1.32x v0's after one step with the reward baseline on). A
    constant's expected gradient is zero (the score function's mean), so taking the sample's mean
    out keeps the direction (the tokens the hint favours up, those it disfavours down) and drops
    the push. A rewrite is the teacher's own answer (gap >= 0 on the whole: towards what the hint
    brought) and is not centred."""
    weights = mask.to(gap.dtype)
    count = weights.sum()
    if count <= 0:
        return gap
    return gap - (gap * weights).sum() / count


def opd_gap(student_logp: Tensor, teacher_logp: Tensor | None) -> Tensor:
    """teacher - student per token, detached; ValueError when the teacher is missing or misshaped."""
    if teacher_logp is None:
        raise ValueError("an opd sample needs teacher_logp")
    if teacher_logp.shape != student_logp.shape:
        raise ValueError(f"teacher_logp {tuple(teacher_logp.shape)} != student {tuple(student_logp.shape)}")
    return teacher_logp.detach().to(student_logp.dtype) - student_logp.detach()


def clip_gap(gap: Tensor, limit: float) -> Tensor:
    """The gap clipped to [-limit, limit]; `limit` 0 leaves it as it is."""
    return gap.clamp(-limit, limit) if limit > 0 else gap


@dataclass
class GapStats:
    """The OPD gaps of a step's opd tokens (unclipped), gathered over its micro-batches."""

    limit: float
    gaps: list[Tensor] = field(default_factory=list)

    def add(self, gap: Tensor) -> None:
        self.gaps.append(gap.detach().float().cpu())

    def metrics(self) -> dict[str, float | None]:
        """Quantiles of the gap (nats) and the share of opd tokens the clip cut; None without opd."""
        keys = ("opd_gap_p05", "opd_gap_p50", "opd_gap_p95", "opd_gap_clipped")
        if not self.gaps or not sum(g.numel() for g in self.gaps):
            return dict.fromkeys(keys)
        every = torch.cat(self.gaps)
        q = torch.quantile(every, torch.tensor([0.05, 0.5, 0.95])).tolist()
        clipped = float((every.abs() > self.limit).float().mean()) if self.limit > 0 else 0.0
        return dict(zip(keys, [*q, clipped], strict=True))


def batch_advantages(
    samples: Sequence[Sample],
    student: Tensor,
    teacher: Tensor | None,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float = 1.0,
    stats: GapStats | None = None,
    opd_centre: bool = False,
    with_gap: bool = True,
) -> Tensor:
    """A [B, T] for a right-padded batch; zero past each sample's response.

    student [B, T]: the response tokens' logprobs after the turns' own prompts (the trainer's);
    teacher [B, T]: the same tokens after the hinted prompts (rows of `rl` samples are ignored
    and may hold anything), or None when the batch has no `opd` sample. `stats` collects the gaps.
    `opd_centre`: each opd sample's gaps less their mean over its trained tokens, but a rewrite's
    (`centred_gap`). `with_gap` False: an opd sample's tokens carry its reward term alone (its
    distillation is the teacher's top-k term instead: train/topk.py); the gaps are still counted.
    """
    if student.dim() != 2 or student.shape[0] != len(samples):
        raise ValueError(f"student must be [B={len(samples)}, T], got shape {tuple(student.shape)}")
    if teacher is not None and teacher.shape != student.shape:
        raise ValueError(f"teacher {tuple(teacher.shape)} != student {tuple(student.shape)}")
    out = torch.zeros_like(student.detach())
    for i, sample in enumerate(samples):
        n = len(sample.response_ids)
        if n > student.shape[1]:
            raise ValueError(f"sample {i} has {n} response tokens, the batch only {student.shape[1]}")
        row_teacher = None if teacher is None else teacher[i, :n]
        row = student[i, :n]
        centre = None
        if opd_centre and sample.kind == "opd" and not sample.rewrite:
            centre = torch.tensor(sample.loss_mask or [1] * n, device=row.device)
        out[i, :n] = advantages(
            kind=sample.kind if with_gap else "rl",
            reward=sample.reward,
            student_logp=row,
            teacher_logp=row_teacher,
            w_rl=w_rl,
            w_opd=w_opd,
            opd_clip=opd_clip,
            centre=centre,
        )
        if stats is not None and sample.kind == "opd":
            stats.add(opd_gap(student[i, :n], row_teacher))
    return out
