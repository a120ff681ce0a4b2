"""`stepwise`: every step of the working shown, one step at a time: `brief`'s opposite.

A user who checks the working, not only the result: they want each calculation written out as its
own step ("24 - 15 = 9"), and enough words around the steps to follow them. Two checks, each with
partial credit so the signal is graded:

    steps    worked steps: lines or sentences that show a calculation (two numbers joined by an
             operator or "=", or an operation in words: "24 minus 15"); full credit from
             `MIN_STEPS` on, a share of it below
    length   at least `MIN_WORDS` words; credit falls linearly to 0 at `MIN_WORDS / 4`

Made for the two-user figures of `clawrl eval --users brief,stepwise` (docs/evaluation.md): the
embedded model often shows some working by itself, `brief` trains it away, and a policy shared by
both users cannot please both. Correctness is not scored, as for `brief`.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.personas.text import word_count
from clawrl.eval.tasks import Task

MIN_STEPS = 3
MIN_WORDS = 60
_NUM = r"\d+(?:[.,]\d+)?"
# "24 - 15", "3 x 8 = 24", "= 9", "24 minus 15", "3 times 8", "36 divided by 6"
CALCULATION = re.compile(
    rf"{_NUM}\s*(?:[-+*/×÷x]|\\times|\\div)\s*{_NUM}|=\s*\$?{_NUM}"
    rf"|{_NUM}\s+(?:plus|minus|times|multiplied by|divided by)\s+{_NUM}",
    re.IGNORECASE,
)
_PIECES = re.compile(r"\n+|(?<=[.!?])\s+(?=[A-Z0-9])")


def worked_steps(answer: str) -> int:
    """The lines or sentences of `answer` that show a calculation."""
    return sum(1 for piece in _PIECES.split(answer) if CALCULATION.search(piece))


def long_enough_credit(words: int, least: int) -> float:
    """1 from `least` words on, falling linearly to 0 at a quarter of that."""
    floor = least // 4
    return 1.0 if words >= least else max(0.0, (words - floor) / (least - floor))


class Stepwise(RulePersona):
    name = "stepwise"
    description = (
        f"A user who checks the working: every calculation written out as its own step, at least "
        f"{MIN_STEPS} steps, explained in at least {MIN_WORDS} words."
    )
    openings = ("{question}", "Can you walk me through this? {question}", "{question} Show your working.")
    thanks = ("Thanks, now I can follow every step.", "Great, that's exactly the working I needed.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        return [self._steps(answer), self._long(answer)]

    def _steps(self, answer: str) -> Check:
        steps = worked_steps(answer)
        return Check(
            min(1.0, steps / MIN_STEPS),
            f"I can't follow how you got there. Write out every calculation as its own step, "
            f"like '24 - 15 = 9', at least {MIN_STEPS} steps.",
            f"Show the working: every calculation as its own step (at least {MIN_STEPS}), "
            "like '24 - 15 = 9'.",
        )

    def _long(self, answer: str) -> Check:
        words = word_count(answer)
        return Check(
            long_enough_credit(words, MIN_WORDS),
            f"That's too short ({words} words). Explain each step so I can follow it.",
            f"Explain each step in full sentences, at least {MIN_WORDS} words in all.",
        )
