"""On-policy distillation against the teacher's likeliest tokens, not only the token sampled.

The gap of OPD (train/advantages.py) rescores the token the policy wrote: `logp(a_t | s + hint) -
logp(a_t | s)`. It can push that token up or down, never bring in another. Issue 53's preferences
showed the limit: with a hint asking for numbered steps, a bold number or a sign-off, the teacher
(the same policy with the hint in its prompt) puts its mass on "1.", "**" or "Hope" at a position
where the policy wrote something else, and the sampled token's gap says only "less of this":
on the policy's own answer the gap's mean is -KL(policy || teacher) <= 0 at every token, a push
down that spreads the policy (docs/evaluation.md).

With `train.opd_topk` K > 0, at every position of an opd sample's answer the teacher pass keeps
its K likeliest tokens and their log-probs q (`batch.score_with(topk=K)`), the policy's pass
scores the same K ids beside its target (one gradient over the logits: train/logprobs.py), and
the distillation term is the forward KL over those K tokens, in place of the sampled gap:

    KL_t = sum_k q_k (log q_k - log p_k)        d KL_t / d z_j = (p_j * sum_k q_k - q_j) / T

a cross-entropy towards what the hinted policy would write at each state the policy visited
(generalised knowledge distillation's on-policy, token-level form, restricted to the teacher's
top K: Qwen3's 151,936-row distributions need not be kept). Tokens the policy never sampled go
up where the teacher favours them, and nothing is pushed down for being sampled. A step's term is
`w_opd * sum_t KL_t / num_tokens`, the token-level mean of every other term (train/loss.py). The
reward term (`w_rl * r`, combine's) stays as it is. The temperature is the sample's, as the gap's.
"""

from __future__ import annotations

import torch
from torch import Tensor


def topk_kl(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor, num_tokens: float) -> Tensor:
    """sum over the masked positions of KL_t (see the module), divided by `num_tokens`: this
    micro-batch's share of the step's token-level mean, with the student's graph.

    student_logp, teacher_logp [S, T, K]: the log-probs of the teacher's K likeliest tokens under
    each; mask [S, T]: the opd samples' trained tokens. Masked-out entries may hold anything."""
    if student_logp.shape != teacher_logp.shape or student_logp.shape[:2] != mask.shape:
        raise ValueError(
            f"student {tuple(student_logp.shape)}, teacher {tuple(teacher_logp.shape)} and mask "
            f"{tuple(mask.shape)} do not line up"
        )
    keep = mask.bool()
    teacher = torch.where(keep[..., None], teacher_logp.detach().to(student_logp.dtype), 0.0)
    student = torch.where(keep[..., None], student_logp, 0.0)
    q = torch.where(keep[..., None], teacher.exp(), 0.0)
    return (q * (teacher - student)).sum() / max(float(num_tokens), 1.0)
