"""Binary RL: the PRM's verdict on a turn is its advantage.

    A_t = r,   r in {-1, 0, +1}  (PRM majority vote; ties and all-failed votes give 0)

for every response token, inside the shared clipped surrogate (see docs/design.md,
"Methods"). Only turns with r != 0 are trained on, since a zero advantage has
no policy gradient (only the KL and entropy terms act on it). At-least-one
guarantee: a session that gave no `rl` sample still contributes its first
scored turn (lowest index) with its reward, so that no judged session is
dropped from the training data entirely.
"""

from __future__ import annotations

from clawrl.algo.base import TeacherPrompt, eligible, make_sample
from clawrl.types import Judgment, Sample, Turn


class BinaryRL:
    name = "rl"
    wants_prm = True
    wants_hint = False

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        if not eligible(turn) or not judgment.score:  # None (not scored) or 0
            return []
        return [make_sample(turn, judgment, "rl", reward=float(judgment.score))]

    def per_rating(self, score: int, hinted: bool) -> int:
        return int(score != 0)

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        if emitted_rl:
            return []
        candidates = [(t, j) for t, j in scored if eligible(t) and j.score is not None]
        if not candidates:
            return []
        turn, judgment = min(candidates, key=lambda pair: pair[0].index)
        return [make_sample(turn, judgment, "rl", reward=float(judgment.score or 0))]
