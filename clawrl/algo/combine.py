"""Combine: binary RL and on-policy distillation on the same turns, as one sample per turn.

    A_t = w_rl * r + w_opd * clip(logp_teacher(a_t | s + hint) - logp(a_t | s), -c, c)

A turn with an accepted hint gives one `opd` sample carrying the PRM's r as its reward (the
trainer adds w_rl * r to every token's clipped gap, train/advantages.py); a turn without a
hint gives an `rl` sample when r != 0. So a turn's tokens count once in the token mean and
its advantage is clipped as one term. The session rule is rl's at-least-one guarantee,
counting every sample that carries a reward.
"""

from __future__ import annotations

from dataclasses import replace

from clawrl.algo.base import TeacherPrompt
from clawrl.algo.opd import OnPolicyDistillation
from clawrl.algo.rl import BinaryRL
from clawrl.types import Judgment, Sample, Turn


class Combine:
    name = "combine"
    wants_prm = True
    wants_hint = True

    def __init__(self) -> None:
        self._rl = BinaryRL()
        self._opd = OnPolicyDistillation()

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        hinted = self._opd.samples(turn, judgment, teacher)
        if hinted:
            return [replace(sample, reward=float(judgment.score or 0)) for sample in hinted]
        return self._rl.samples(turn, judgment, teacher)

    def per_rating(self, score: int, hinted: bool) -> int:
        return 1 if hinted else self._rl.per_rating(score, hinted)

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        return self._rl.session_end(scored, emitted_rl)
