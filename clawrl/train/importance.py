"""Truncated importance weights: the off-policy correction of every sample, on every engine.

Per response token t of a sample (decoupled PPO with truncated importance sampling, as AReaL
and the train-vs-serve mismatch literature do it):

    mu_t     = the behaviour logprob: what the sampler drew the token from, recorded as it was
               (tempered, top-k/top-p truncated, penalised, under a grammar)
    prox_t   = log pi_prox(a_t): the trainer's own logprob before this step (detached)
    w_t      = min(exp(prox_t - mu_t), C)                        C = train.is_cap (2)

The loss weights each token's clipped surrogate by w_t and clips the ratio pi_theta / pi_prox
(train/loss.py). w_t corrects for everything that makes the served tokens not the trainer's own
samples: staleness (the sample was made by an older version), the sampler (a top-k cut makes
w_t the mass of the top k under the trainer, a penalty the ratio of the two distributions),
and train-vs-serve numerics (bf16 vLLM against the trainer). Truncating at C bounds the
variance one token can add; the truncated tokens are counted.

A sample without recorded logprobs (a store older than logprob recording) trains with weight
1 and is counted (`is_unweighted_samples`). `mismatch` is the mean |prox_t - mu_t| over the
weighted tokens: how far the behaviour was from the trainer, for every step that trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class WeightSums:
    """Per-micro-batch sums, added over a step (and over ranks) before `metrics`."""

    weight_sum: float = 0.0
    weight_min: float = float("inf")
    truncated_tokens: float = 0.0
    truncated_samples: float = 0.0
    unweighted_samples: float = 0.0
    mismatch_sum: float = 0.0
    tokens: float = 0.0

    def add(self, other: WeightSums) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, min(mine, theirs) if f.name == "weight_min" else mine + theirs)

    def reduced(
        self, total: Callable[[dict[str, float]], dict[str, float]], lowest: Callable[[float], float]
    ) -> WeightSums:
        """These sums over every rank of a group (`total` sums a dict, `lowest` takes a min)."""
        summed = total({f.name: getattr(self, f.name) for f in fields(self) if f.name != "weight_min"})
        return replace(self, **summed, weight_min=lowest(self.weight_min))

    def metrics(self) -> dict[str, float | int | None]:
        """`is_weight_mean`, `is_weight_min`, `is_truncated_frac`, the counts and `mismatch`."""
        n = self.tokens
        return {
            "is_weight_mean": self.weight_sum / n if n else None,
            "is_weight_min": self.weight_min if n else None,
            "is_truncated_frac": self.truncated_tokens / n if n else 0.0,
            "is_truncated_samples": int(self.truncated_samples),
            "is_unweighted_samples": int(self.unweighted_samples),
            "mismatch": self.mismatch_sum / n if n else None,
            "mismatch_tokens": int(n),
        }


def truncated_weights(
    prox: Tensor, behaviour: Tensor, mask: Tensor, recorded: Tensor, cap: float
) -> tuple[Tensor, WeightSums]:
    """w [B, T] = min(exp(prox - behaviour), cap) on masked tokens of rows with `recorded` [B]
    logprobs, 1 elsewhere (detached), and the sums for the step's metrics."""
    if cap <= 0:
        raise ValueError(f"train.is_cap must be > 0, got {cap}")
    keep = mask.bool() & recorded[:, None]
    log_w = torch.where(keep, prox.detach() - behaviour, 0.0)
    raw = log_w.exp()
    weights = torch.where(keep, raw.clamp(max=cap), 1.0)
    cut = keep & (raw > cap)
    sums = WeightSums(
        weight_sum=float(weights[keep].sum()),
        weight_min=float(weights[keep].min()) if keep.any() else float("inf"),
        truncated_tokens=float(cut.sum()),
        truncated_samples=float(cut.any(dim=1).sum()),
        unweighted_samples=float((~recorded).sum()),
        mismatch_sum=float(log_w.abs()[keep].sum()),
        tokens=float(keep.sum()),
    )
    return weights, sums
