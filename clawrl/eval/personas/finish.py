"""`finish`: stop once you have answered: the reply ends on the result, nothing after it.

Why this one: the embedded model often goes on after its result, with a remark
("This is a classic example of a simple division problem, where ..."), a summary
of the method, or a restart of the working, and behind OpenClaw with "Here's ...".
This user reads the end of a reply first (an agent's chat window scrolls to it)
and wants the number there. Not length, not the opener, not whether the number is
right: only what comes after the last number. Partial credit:

    1.0  the last sentence states a number (the reply ends on its result)
    0.5  one sentence follows the last one that does
    0.0  more follow, no sentence states a number at all, or the reply stops
         mid-sentence (cut off by the token limit)

A sentence ends at ".", "!" or "?" followed by a space, or at a line break. A reply
whose last sentence has no ".", "!" or "?" at its end stopped mid-sentence, unless
that sentence is at most five words ("#### 24", "The answer is: 60"): a cut-off
reply, seen from its text alone, can still pass that way.

Written for issue 35 (a persona clawrl was never tuned on); held out like `direct`
and `autograde`.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.tasks import Task

SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
DIGIT = re.compile(r"\d")
SHORT_WORDS = 5  # a last sentence this short may end without a full stop ("#### 24")
HINT = "End with the final number: stop right after it, with no remark, summary or offer after it."


def sentences(text: str) -> list[str]:
    """`text` cut into sentences (see the module's doc); empty pieces dropped."""
    return [s.strip() for s in SENTENCE_END.split(text.strip()) if s.strip()]


class Finish(RulePersona):
    name = "finish"
    description = (
        "A user who reads the end of a reply first: it must end on the result, the number, "
        "with no remark, summary or offer after it."
    )
    openings = ("{question}", "{question} Just tell me what it comes to.", "Need this one: {question}")
    thanks = ("Thanks, right there at the end.", "Perfect, thanks.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        parts = sentences(answer)
        numbered = [i for i, part in enumerate(parts) if DIGIT.search(part)]
        if not numbered:
            return [Check(0.0, "I can't find a number anywhere in that. What does it come to?", HINT)]
        last = parts[-1]
        if last[-1] not in ".!?" and len(last.split()) > SHORT_WORDS:
            return [Check(0.0, "That stops mid-sentence, and I still can't see where it lands.", HINT)]
        after = len(parts) - 1 - numbered[-1]
        if after == 0:
            return [Check(1.0, "", HINT)]
        if after == 1:
            return [
                Check(
                    0.5,
                    "Nearly: you went on for a sentence after the result. Stop at the number.",
                    HINT,
                )
            ]
        return [
            Check(
                0.0,
                "The number is buried and you keep going after it. End on the result, with nothing after it.",
                HINT,
            )
        ]
