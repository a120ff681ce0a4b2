"""`brief`: answers in at most 30 words.

One check: the length is at most `MAX_WORDS` words, with credit falling linearly to 0
at four times that. A small chat model explains step by step by default, so brevity is
a preference it has to learn. Correctness is deliberately not part of the score (an
earlier version averaged it in): a 135M model's arithmetic is not something a few
training steps change, so it only diluted the preference being measured, and a user
this busy rates the form of the answer.
"""

from __future__ import annotations

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.personas.text import length_credit, word_count
from clawrl.eval.tasks import Task

MAX_WORDS = 30


class Brief(RulePersona):
    name = "brief"
    description = (
        f"A busy user who wants just the answer in at most {MAX_WORDS} words: "
        "no working, no explanation, no preamble."
    )
    openings = ("{question}", "Quick one: {question}", "{question} Thanks.")
    thanks = ("Thanks, that's perfect.", "Perfect, thanks.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        return [self._short(answer)]

    def _short(self, answer: str) -> Check:
        words = word_count(answer)
        return Check(
            length_credit(words, MAX_WORDS, 4 * MAX_WORDS),
            f"That's far too long ({words} words). Just give me the answer in one sentence, "
            f"under {MAX_WORDS} words, with no working.",
            f"Answer in one short sentence of under {MAX_WORDS} words, with no working.",
        )
