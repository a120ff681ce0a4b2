"""`direct`: never open with "To solve this problem, we need to ..." or its cousins.

Why this one: the embedded model opens most maths answers with a stock preamble
("To solve this problem, we need to ...", "To find out how many ..."), greedy
and sampled alike, and this user is tired of reading it. The preference is about
one habit of phrasing, not length: an answer of any length that starts with the
point is fully fine. Partial credit keeps the signal graded:

    1.0  no stock opener anywhere
    0.5  the opener appears, but not as the first words (the answer starts with the point)
    0.0  the answer opens with it

Held out: clawrl's defaults are tuned on `brief`, never on this persona.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.tasks import Task

# "To solve this (problem)", "To find (out) ...", "To calculate/determine/figure out ...", "we need to"
OPENER = re.compile(
    r"\b(to (solve|find|calculate|determine|figure out|work out|answer)\b|we need to\b|let'?s break)",
    re.IGNORECASE,
)


class Direct(RulePersona):
    name = "direct"
    description = (
        'A user who wants answers to start with the point: never "To solve this problem, we need to..." '
        'or "To find out...", anywhere in the answer.'
    )
    openings = ("{question}", "Can you help with this? {question}", "{question} Go.")
    thanks = ("Thanks, straight to the point.", "Perfect, thanks.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        hint = 'Start with the answer itself; never write "To solve this problem" or "we need to".'
        found = OPENER.search(answer)
        if found is None:
            return [Check(1.0, "", hint)]
        if found.start() > 0 and answer[: found.start()].strip():
            return [Check(0.5, f'Better, but drop the "{found.group(0)}" bit entirely. Just say it.', hint)]
        return [
            Check(
                0.0,
                f'Please don\'t open with "{found.group(0)}...". Start with the point itself.',
                hint,
            )
        ]
