"""GRPO: episodes of one task, scored by their environment, advantages relative to the group.

A group is G episodes of one task (Track 2, clawrl/envs). Once all G are in,

    A_i = (R_i - mean(R)) / (std(R) + eps)        (or R_i - mean(R) with `normalize_std` off)

and every trainable main turn of episode i gets a sample of kind `rl` whose reward is
A_i, inside the shared clipped surrogate (docs/design.md, "Methods"). std is the
sample standard deviation (Bessel's correction), as TRL's GRPOTrainer computes it.

Options, off by default:
- `judge_coef` c > 0: a turn the judge scored also gets c * r_t (r_t in {-1, 0, +1},
  the PRM's majority vote on that step): A_it = A_i + c * r_t.
- `episode_weighting`: the loss is a token mean, so an episode of many long turns
  counts more than a short one; with this on, the samples of episode i are scaled by
  mean_j(T_j) / T_i (T: the episode's response tokens), so each episode weighs the same.

Dropped groups (no sample; `GroupOutcome.reason` says why): fewer than two episodes
with a reward (a dropped episode has none), or every reward equal (A_i = 0 for all:
no policy gradient). Samples whose advantage is exactly 0 are not written either.

Per-turn judgments alone give no sample under this method (`samples` returns []).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from clawrl.algo.base import TeacherPrompt, eligible, make_sample
from clawrl.types import GROUP_DROPPED, GROUP_USED, Judgment, Sample, Turn

EQUAL = 1e-9  # rewards closer than this count as equal


@dataclass(frozen=True)
class EpisodeTurns:
    """One episode of a group as the method sees it: its reward and its turns with their judgments."""

    reward: float | None  # None: the episode was dropped
    turns: Sequence[Turn]
    judgments: dict[str, Judgment] = field(default_factory=dict)  # turn id -> latest judgment


@dataclass(frozen=True)
class GroupOutcome:
    status: str  # GROUP_USED | GROUP_DROPPED
    reason: str | None
    mean: float | None
    std: float | None
    samples: list[Sample]


@dataclass(frozen=True)
class GroupRelative:
    name: str = "grpo"
    normalize_std: bool = True
    eps: float = 1e-6
    judge_coef: float = 0.0
    episode_weighting: bool = False
    wants_hint: bool = False

    @property
    def wants_prm(self) -> bool:  # the judge votes on steps only when its votes are read
        return self.judge_coef > 0

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        return []  # a step's judgment counts only inside its group (`group`)

    def per_rating(self, score: int, hinted: bool) -> int:
        return 0  # its samples come from groups of episodes, never from a rating

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        return []

    def group(self, episodes: Sequence[EpisodeTurns]) -> GroupOutcome:
        """The samples of one complete group, or why it is dropped."""
        rewards = [e.reward for e in episodes if e.reward is not None]
        if len(rewards) < 2:
            return GroupOutcome(
                status=GROUP_DROPPED,
                reason=f"{len(rewards)} episode(s) with a reward",
                mean=None,
                std=None,
                samples=[],
            )
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        if max(rewards) - min(rewards) < EQUAL:
            return GroupOutcome(
                status=GROUP_DROPPED, reason=f"equal rewards ({rewards[0]:g})", mean=mean, std=std, samples=[]
            )
        scored = [e for e in episodes if e.reward is not None]
        weights = self._weights(scored)
        samples = []
        for episode, weight in zip(scored, weights, strict=True):
            assert episode.reward is not None
            a = episode.reward - mean
            if self.normalize_std:
                a /= std + self.eps
            samples += self._episode_samples(episode, a, weight)
        return GroupOutcome(status=GROUP_USED, reason=None, mean=mean, std=std, samples=samples)

    def _weights(self, episodes: Sequence[EpisodeTurns]) -> list[float]:
        if not self.episode_weighting:
            return [1.0] * len(episodes)
        tokens = [sum(len(t.response_ids) for t in e.turns if eligible(t)) for e in episodes]
        mean = sum(tokens) / len(tokens)
        return [mean / n if n else 0.0 for n in tokens]

    def _episode_samples(self, episode: EpisodeTurns, advantage: float, weight: float) -> list[Sample]:
        out = []
        for turn in episode.turns:
            if not eligible(turn):
                continue
            judgment = episode.judgments.get(turn.id)
            step = self.judge_coef * (judgment.score or 0) if judgment is not None else 0.0
            value = (advantage + step) * weight
            if value != 0.0:
                out.append(make_sample(turn, judgment, "rl", reward=value))
        return out
