"""The loss every method trains with: a PPO-style clipped surrogate, k3 KL, entropy bonus.

Per response token t (docs/design.md, "Methods"):

    rho_t = exp(logp_t - old_logp_t)           old_logp = the proximal policy's logprob: the
                                               trainer's own before the step (train/importance.py)
    s_t   = min(rho_t * A_t, clip(rho_t, 1 - eps, 1 + eps_high) * A_t)
    s_t   = max(s_t, dual_clip * A_t)        where A_t < 0 (dual-clip; dual_clip = 0: off)
    s_t   = w_t * s_t                        w_t = min(pi_prox / mu, C): the truncated importance
                                             weight of the behaviour mu (1 when none is given)
    k3_t  = min(exp(d_t) - d_t - 1, kl_clamp),  d_t = ref_logp_t - logp_t   (estimates KL(pi || pi_ref))

    L_pg  = -mean_t s_t
    L     = L_pg + kl_coef * mean_t k3_t - entropy_coef * mean_t H_t

eps = 0.2, eps_high = 0.28, dual_clip = 3, kl_clamp = 10, kl_coef = 0.02, entropy_coef = 0.

Choices and deviations:

- Token-level mean. Every `mean_t` is the sum over the masked (real) tokens of
  the whole batch divided by the number of those tokens, not a mean of
  per-sequence means (DAPO's choice, where GRPO averages per sequence first):
  each token weighs the same, so the tokens of a long answer are not diluted
  to the weight of a one-word answer's. When one optimizer step is split into
  micro-batches, pass the step's total token count as `num_tokens`; the loss
  and the mean metrics are then that micro-batch's share, and summing them
  over the micro-batches gives the step's values.
- Asymmetric clipping (eps_high > eps, DAPO's "clip-higher"): a token with a
  positive advantage may gain more probability than one with a negative
  advantage may lose, which keeps low-probability tokens explorable.
- KL by the k3 estimator (Schulman, "Approximating KL divergence"): unbiased
  for KL(pi_theta || pi_ref) on tokens sampled from pi_theta, never negative,
  and low-variance. Its gradient, (1 - exp(d_t)) per token w.r.t. logp_t,
  pulls logp toward ref_logp; as in GRPO it is the estimate's gradient, not an
  exact KL gradient. Our tokens come from the behaviour policy, which is
  pi_theta up to staleness and the sampler; the importance weight is not applied to
  this term (it is a regulariser on the tokens trained, not an estimate under mu).
- Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"): with
  A_t < 0 the PPO min is unbounded as rho_t grows (min(rho*A, clip*A) = rho*A), so one token
  whose behaviour logprob is far below the trainer's (a stale sample, an engine-vs-trainer
  numeric difference) can dominate a step. Bounding s_t at dual_clip * A_t caps its share; the
  gradient of a bounded token is 0. `dual_frac` counts them.
- The k3 term is clamped per token at `kl_clamp` (verl's low-variance KL clamps at 10): where
  the reference is far likelier than the policy, exp(d_t) explodes; a clamped token carries no
  KL gradient that step.
- Gradients flow through `logp` (and `entropy`, when the caller's entropy has a
  graph) only: `old_logp`, `ref_logp` and `advantages` are detached.

`token_logprobs` turns logits into the per-token `logp` and `H_t` above, under
the same temperature-scaled distribution the sampler used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LossTerms:
    """The loss to backprop, and detached 0-d tensors for metrics (see `metrics`)."""

    loss: Tensor  # scalar with a graph
    pg_loss: Tensor  # L_pg
    kl: Tensor  # mean_t k3_t (0 when no ref_logp was given)
    entropy: Tensor  # mean_t H_t (0 when no entropy was given)
    clip_frac: Tensor  # share of masked tokens whose clipped term was taken
    dual_frac: Tensor  # share of masked tokens bounded by the dual clip
    ratio_mean: Tensor  # mean_t rho_t
    tokens: Tensor  # number of masked tokens in this batch
    # The opd top-k term's share of the step's mean, added to `loss` by the trainer (train/topk.py).
    opd_topk_kl: Tensor = field(default_factory=lambda: torch.zeros(()))

    def metrics(self) -> dict[str, float]:
        """The metrics as Python floats."""
        values = {
            "pg_loss": self.pg_loss,
            "kl": self.kl,
            "entropy": self.entropy,
            "clip_frac": self.clip_frac,
            "dual_frac": self.dual_frac,
            "ratio_mean": self.ratio_mean,
            "tokens": self.tokens,
        }
        return {name: float(value) for name, value in values.items()}


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    eps: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.02,
    entropy_coef: float = 0.0,
    num_tokens: float | None = None,
    dual_clip: float = 3.0,
    kl_clamp: float = 10.0,
    is_weight: Tensor | None = None,
) -> LossTerms:
    """The clipped-surrogate loss of the module docstring over a right-padded batch.

    All tensors are [B, T] over response tokens (`advantages` may be anything
    that broadcasts to it, e.g. [B, 1]); `mask` is 1/True on real tokens.
    Masked-out positions may hold any value, even inf: they are zeroed before
    use and change neither the loss nor its gradient. `num_tokens` replaces the
    denominator of every mean (the whole step's count under micro-batching). `is_weight` [B, T]
    (detached) scales each token's surrogate: the truncated importance weight.
    """
    keep = _check(
        logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, ref_logp=ref_logp, entropy=entropy
    )
    count = keep.sum()
    # An all-padding batch gives a zero loss (with a graph) rather than 0/0.
    denom = count.clamp(min=1).to(logp.dtype) if num_tokens is None else logp.new_tensor(float(num_tokens))

    def mean(x: Tensor) -> Tensor:  # token-level: sum over every masked token / their number
        return torch.where(keep, x, 0.0).sum() / denom

    # Zero padded positions *before* exp: exp(inf) * 0 would be nan, in the loss and its gradient.
    log_ratio = torch.where(keep, logp - old_logp.detach(), 0.0)
    adv = torch.where(keep, advantages.detach().to(logp.dtype), 0.0)
    ratio = log_ratio.exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    dual = torch.zeros_like(keep)
    if dual_clip > 0:
        dual = (adv < 0) & (surrogate < dual_clip * adv)
        surrogate = torch.where(dual, dual_clip * adv, surrogate)
    if is_weight is not None:
        surrogate = surrogate * torch.where(keep, is_weight.detach().to(logp.dtype), 0.0)
    pg_loss = -mean(surrogate)
    loss = pg_loss

    kl = mean_entropy = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if ref_logp is not None:
        d = torch.where(keep, ref_logp.detach() - logp, 0.0)
        kl = mean((d.exp() - d - 1.0).clamp(max=kl_clamp))
        if kl_coef > 0:
            loss = loss + kl_coef * kl
    if entropy is not None:
        mean_entropy = mean(entropy)
        if entropy_coef > 0:
            loss = loss - entropy_coef * mean_entropy

    return LossTerms(
        loss=loss,
        pg_loss=pg_loss.detach(),
        kl=kl.detach(),
        entropy=mean_entropy.detach(),
        # The min took the clipped term: the ratio left the trust region the way A pushes it.
        clip_frac=mean((clipped < unclipped).to(logp.dtype)).detach(),
        dual_frac=mean(dual.to(logp.dtype)).detach(),
        ratio_mean=mean(ratio).detach(),
        tokens=count.detach(),
    )


def _check(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
    entropy: Tensor | None,
) -> Tensor:
    """The mask as bool, after checking that every input lines up with logp [B, T]."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    named = {"old_logp": old_logp, "mask": mask, "ref_logp": ref_logp, "entropy": entropy}
    for name, x in named.items():
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, logp has {tuple(logp.shape)}")
    try:
        torch.broadcast_shapes(advantages.shape, logp.shape)
    except RuntimeError:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not broadcast to {tuple(logp.shape)}"
        ) from None
    return mask.bool()


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float | Tensor) -> tuple[Tensor, Tensor]:
    """Per-token log-probs of `targets` and entropies under softmax(logits / temperature).

    logits [B, T, V] are those at the positions that predict targets [B, T];
    temperature is a float or a per-sequence [B] tensor, and 0 (greedy
    sampling, whose logprobs were recorded at temperature 1) means 1. Returns
    (logp [B, T], entropy [B, T]), both with their graphs; detach the entropy
    (or compute under no_grad) when no entropy bonus is used, since its graph
    holds another [B, T, V]. Half-precision logits are scored in float32.
    Negative targets (an ignore-index padding) read as token 0: mask them.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    temp = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device)
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))
    if temp.dim() == 1:  # per sequence: [B] -> [B, 1, 1]
        temp = temp[:, None, None]
    log_probs = torch.log_softmax(logits / temp, dim=-1)  # [B, T, V]
    logp = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy
