"""A step's reward baseline (`train.reward_baseline`): each judged reward less the mean of the others'.

    A_rl(i) = r_i - mean_{j != i} r_j        over the step's samples that carry a judge's reward

Binary RL with no baseline pushes every token of a -1 answer down. When a user's preference is
one the policy never meets (issue 53's `numbered`, `bold`, `signoff`: 0 of 16 sampled answers at
v0), every judged turn reads -1, every step is all negative, and the push spreads the policy's
mass over whatever it did not write: the answer entropy rose to 1.35-1.6x v0's and the canary gate
held the next versions. A leave-one-out baseline (REINFORCE with a baseline, RLOO's over a step)
makes an all -1 step carry no reward term at all, so what teaches there is the hint (opd's gap and
the hint rewrites); a +1 among -1s is pushed up by 2 and each -1 down by 2/3 of one. The expected
gradient is unchanged (the baseline does not depend on the sample it is subtracted from).

Only the judge's reward is centred: a hint rewrite or a memory distillation sample carries reward 0
meaning "no reward", not a verdict, and keeps it. A step with fewer than two judged samples is left
as it is. Pure: no torch, no store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from clawrl.types import Sample

BASELINES = ("batch", "none")


def judged(sample: Sample) -> bool:
    """Whether the sample's reward is a judge's verdict (not a rewrite's or a distillation's 0)."""
    return not sample.rewrite and not sample.experience_ids


def centred(samples: Sequence[Sample], baseline: str = "batch") -> list[Sample]:
    """The samples with each judged reward less the leave-one-out mean of the step's other judged
    rewards; unchanged with `baseline` "none" or fewer than two judged samples."""
    if baseline not in BASELINES:
        raise ValueError(f"unknown reward baseline {baseline!r}; known: {', '.join(BASELINES)}")
    rewards = [s.reward for s in samples if judged(s)]
    if baseline == "none" or len(rewards) < 2:
        return list(samples)
    total, others = sum(rewards), len(rewards) - 1
    return [replace(s, reward=s.reward - (total - s.reward) / others) if judged(s) else s for s in samples]
