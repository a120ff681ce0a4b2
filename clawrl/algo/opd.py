"""On-policy distillation: the policy, shown a hindsight hint, teaches itself.

    A_t = logp_teacher(a_t | s + hint) - logp_old(a_t | s)

per response token a_t, inside the shared clipped surrogate (see docs/design.md,
"Methods"). `s + hint` is the enhanced prompt (clawrl.algo.teacher): the same
messages with the accepted hint appended to the last user message. The
response token IDs are the turn's own, unchanged; the trainer scores them
under `teacher_prompt_ids` (by default with the live policy, at update time).
The sample's reward is unused (0.0). Only turns whose hint judge accepted a
hint are trained on; there is no session-level rule.
"""

from __future__ import annotations

from clawrl.algo.base import TeacherPrompt, eligible, make_sample
from clawrl.types import Judgment, Sample, Turn


class OnPolicyDistillation:
    name = "opd"
    wants_prm = False
    wants_hint = True

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        if not eligible(turn) or not judgment.hint:
            return []
        hint = judgment.hint
        return [make_sample(turn, judgment, "opd", hint=hint, teacher_prompt_ids=teacher(turn, hint))]

    def per_rating(self, score: int, hinted: bool) -> int:
        return int(hinted)

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        return []
