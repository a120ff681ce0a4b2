"""`student`: homework help that must not look AI-written.

The student pastes a homework problem and asks for help. They want the right number
in plain sentences they could have written themselves, so each of these is a check:
no markdown bold, no numbered or bulleted lists, no headings, no "Step 1" / "Final
answer" style labels, no LaTeX (`\\boxed`, `\\frac`, `$$`), and the correct answer
stated somewhere. The score is the share of checks passed (six in all).

Chat-tuned models default to exactly this formatting, so it is a preference that the
conversation's complaints ("Please don't use bold text or lists ...") can teach.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona, answer_check
from clawrl.eval.personas.text import join_words
from clawrl.eval.tasks import Task

# (pattern, what the student complains about, the same in the hint)
STYLE_RULES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"\*\*|__"), "bold text", "bold"),
    (re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)])\s+", re.MULTILINE), "numbered or bulleted lists", "lists"),
    (re.compile(r"^\s*#{1,6}\s", re.MULTILINE), "headings", "headings"),
    (
        re.compile(
            r"\bfinal answer\b|\bstep\s*\d+\b|^\s*(?:answer|solution)\s*:", re.IGNORECASE | re.MULTILINE
        ),
        "labels like 'Step 1' or 'Final answer'",
        "'Step'/'Final answer' labels",
    ),
    (re.compile(r"\\boxed|\\frac|\\times|\\\(|\\\[|\$\$"), "LaTeX like \\boxed", "LaTeX"),
)
_STYLE_ASKS = frozenset(what for _, what, _ in STYLE_RULES)


class Student(RulePersona):
    name = "student"
    description = (
        "A student asking for homework help who does not want the answer to look AI-written: "
        "plain sentences with the correct number, and no markdown bold, numbered or bulleted lists, "
        "headings, 'Step 1' or 'Final answer' labels, or LaTeX such as \\boxed."
    )
    openings = (
        "Can you help me with my homework? {question}",
        "I'm stuck on this one from my worksheet: {question} Can you explain it?",
        "Homework question: {question} How do I work it out?",
    )
    thanks = ("Thanks, that's perfect.", "Thanks, that makes sense and reads like something I'd write.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        style = [Check(0.0 if p.search(answer) else 1.0, what, hint) for p, what, hint in STYLE_RULES]
        return [*style, answer_check(task, answer)]

    def complain(self, missed: list[Check]) -> tuple[str, str]:
        style = [c for c in missed if c.complaint in _STYLE_ASKS]
        other = [c for c in missed if c not in style]
        messages, hints = [c.complaint for c in other], [c.hint for c in other]
        if style:
            messages.insert(
                0,
                f"Please don't use {join_words([c.complaint for c in style])}, it looks AI-written; "
                "write it as plain sentences like a student would.",
            )
            hints.insert(0, f"Write plain prose with no {join_words([c.hint for c in style])}.")
        return " ".join(messages), " ".join(hints)
