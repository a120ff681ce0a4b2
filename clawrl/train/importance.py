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
weighted tokens: how far the behaviour was from the trainer, for every step that trained. It
mixes several causes, so beside it each token counts under the first cause its sample has
(`mismatch_cause`), as `mismatch_<cause>` (None: no token of that cause in the step):

    conditioned  mu was recorded under another prompt than the one scored: a memory distillation
                 sample (the served prompt had the memory block) or a hint rewrite
    stale        made by another version than the one trained from
    processed    the sampler's logprobs are not the tempered distribution the trainer scores
                 (a top-k/top-p cut, a penalty, a prefix's KV from an older version:
                 Turn.logprobs_exact)
    exact        none of these: same version, untruncated, unpenalised, same prompt. What is
                 left is numerics (the engine against the trainer), so `mismatch_exact` is the
                 figure that flags a serving-vs-training numerics regression.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from clawrl.types import Sample

CAUSES = ("exact", "stale", "processed", "conditioned")  # a token's mismatch cause, by index


def mismatch_cause(sample: Sample, current: str | None) -> int:
    """The index in `CAUSES` of the first cause that sets `sample`'s behaviour apart from what the
    trainer scores; `current`: the version trained from (None: not known, no sample is stale)."""
    if sample.experience_ids or sample.rewrite:
        return CAUSES.index("conditioned")
    if current is not None and sample.version != current:
        return CAUSES.index("stale")
    if not sample.logprobs_exact:
        return CAUSES.index("processed")
    return CAUSES.index("exact")


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
    # |prox - mu| and tokens by cause, in the order of CAUSES
    mismatch_exact: float = 0.0
    mismatch_stale: float = 0.0
    mismatch_processed: float = 0.0
    mismatch_conditioned: float = 0.0
    tokens_exact: float = 0.0
    tokens_stale: float = 0.0
    tokens_processed: float = 0.0
    tokens_conditioned: float = 0.0

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
        """`is_weight_mean`, `is_weight_min`, `is_truncated_frac`, the counts, `mismatch` and, by
        cause, `mismatch_<cause>` (None without such a token) and `mismatch_exact_tokens`."""
        n = self.tokens
        by_cause = {}
        for cause in CAUSES:
            k = getattr(self, f"tokens_{cause}")
            by_cause[f"mismatch_{cause}"] = getattr(self, f"mismatch_{cause}") / k if k else None
        return {
            "is_weight_mean": self.weight_sum / n if n else None,
            "is_weight_min": self.weight_min if n else None,
            "is_truncated_frac": self.truncated_tokens / n if n else 0.0,
            "is_truncated_samples": int(self.truncated_samples),
            "is_unweighted_samples": int(self.unweighted_samples),
            "mismatch": self.mismatch_sum / n if n else None,
            "mismatch_tokens": int(n),
            **by_cause,
            "mismatch_exact_tokens": int(self.tokens_exact),
        }


def truncated_weights(
    prox: Tensor,
    behaviour: Tensor,
    mask: Tensor,
    recorded: Tensor,
    cap: float,
    causes: Tensor | None = None,
) -> tuple[Tensor, WeightSums]:
    """w [B, T] = min(exp(prox - behaviour), cap) on masked tokens of rows with `recorded` [B]
    logprobs, 1 elsewhere (detached), and the sums for the step's metrics. `causes` [B]: each
    row's index in `CAUSES` (`mismatch_cause`); None: every row `exact`."""
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
    rows = torch.zeros(len(keep), dtype=torch.long, device=keep.device) if causes is None else causes
    for i, cause in enumerate(CAUSES):
        mine = keep & (rows == i)[:, None]
        setattr(sums, f"mismatch_{cause}", float(log_w.abs()[mine].sum()))
        setattr(sums, f"tokens_{cause}", float(mine.sum()))
    return weights, sums
