"""Combine: binary RL and on-policy distillation on the same turns.

    A_t = w_rl * r + w_opd * (logp_teacher(a_t | s + hint) - logp_old(a_t | s))

A turn can yield an `rl` sample (r != 0) and an `opd` sample (accepted hint);
the trainer weighs the two kinds with w_rl and w_opd. The session rule is
rl's at-least-one guarantee.
"""

from __future__ import annotations

from clawrl.algo.base import TeacherPrompt
from clawrl.algo.opd import OnPolicyDistillation
from clawrl.algo.rl import BinaryRL
from clawrl.types import Judgment, Sample, Turn


class Combine:
    name = "combine"
    kinds = ("rl", "opd")
    wants_prm = True
    wants_hint = True

    def __init__(self) -> None:
        self._rl = BinaryRL()
        self._opd = OnPolicyDistillation()

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        return self._rl.samples(turn, judgment, teacher) + self._opd.samples(turn, judgment, teacher)

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        return self._rl.session_end(scored, emitted_rl)
