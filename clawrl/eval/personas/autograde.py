"""`autograde`: the last line must be exactly "Answer: <number>", for the user's grading script.

Why this one: a required format for the final number, which the embedded model
does not use by itself (it ends with "So, the answer is 11." or "The answer is: 12"
when it states one at all). The preference is about the format only, not whether
the number is right, and not length. Partial credit follows how close the ending
is, so a model that already says "the answer is N" earns something to build on:

    1.0  the last line is "Answer: N" (N a number, nothing else on the line)
    0.5  "Answer: N" appears but is not the last line, or the last line states
         "the answer is N" in words
    0.0  otherwise

Held out: clawrl's defaults are tuned on `brief`, never on this persona.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.tasks import Task

NUMBER = r"-?\$?\d[\d,]*(\.\d+)?"
FINAL = re.compile(rf"^Answer: {NUMBER}$")
ANYWHERE = re.compile(rf"(^|\n)Answer: {NUMBER}\s*(\n|$)")
IN_WORDS = re.compile(rf"answer is:? {NUMBER}", re.IGNORECASE)


class Autograde(RulePersona):
    name = "autograde"
    description = (
        'A user whose grading script reads only the last line, which must be exactly "Answer: <number>" '
        "(for example Answer: 42), with nothing after it."
    )
    openings = ("{question}", "For my checker: {question}", "{question} (it gets auto-graded)")
    thanks = ("Thanks, the script read it fine.", "Perfect, thanks.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        hint = 'End with a last line that is exactly "Answer: N", the final number, and nothing after it.'
        lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if FINAL.match(last):
            return [Check(1.0, "", hint)]
        if ANYWHERE.search(answer.strip()) or IN_WORDS.search(last):
            return [
                Check(
                    0.5,
                    'Close. My script only reads the very last line, and it must be exactly "Answer: N", '
                    "like Answer: 42, with nothing after it.",
                    hint,
                )
            ]
        return [
            Check(
                0.0,
                'My grading script needs the last line to be exactly "Answer: N", like Answer: 42. '
                "Please end with that.",
                hint,
            )
        ]
