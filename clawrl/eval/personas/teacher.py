"""`teacher`: a grading comment on a student's answer, specific and friendly.

The teacher quotes the task and a (scripted) student's answer to it, right for about
half the tasks and off by one to three for the others (fixed per task id), and asks
for a comment to write on the paper. A good comment is

- specific: it names the student's number or the correct one;
- warm: it has an encouraging word ("great", "nice", "good effort", "well done", ...);
- not harsh: no "wrong!", "terrible", "careless", "!!" and the like;
- short: up to 60 words, with partial credit falling to 0 at 180 words.

The score is the mean of the four.
"""

from __future__ import annotations

import re

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.personas.text import length_credit, mentions_answer, pick, stable_hash, word_count
from clawrl.eval.tasks import Task

MAX_WORDS = 60
WARM = re.compile(
    r"\b(great|nice|good|well done|excellent|lovely|awesome|fantastic|keep it up|keep up|proud|"
    r"almost|so close|nearly)\b",
    re.IGNORECASE,
)
HARSH = re.compile(
    r"wrong\s*!|!!|\b(terrible|stupid|careless|lazy|awful|pathetic|horrible|ridiculous|sloppy|"
    r"hopeless|useless)\b",
    re.IGNORECASE,
)


def student_answer(task: Task) -> int:
    """The scripted student's answer: right for about half the tasks, else off by 1 to 3."""
    h = stable_hash("teacher", task.id)
    if h % 2 == 0:
        return task.answer
    off = 1 + (h >> 1) % 3
    return task.answer - off if (h >> 3) % 2 and task.answer > off else task.answer + off


class Teacher(RulePersona):
    name = "teacher"
    description = (
        "A teacher asking for a grading comment on a student's answer. They want it specific "
        "(it names the student's number or the correct one), friendly (an encouraging word like "
        "'great' or 'good effort', nothing harsh like 'wrong!' or 'careless') and short "
        f"(at most {MAX_WORDS} words)."
    )
    openings = (
        'I\'m marking homework. The problem was: "{question}" My student answered {student}. '
        "Could you write a short comment I can put on their paper?",
        'Can you help me grade this? Question: "{question}" The student\'s answer: {student}. '
        "I need a comment to write next to it.",
    )
    thanks = ("Thanks, that's perfect, I'll use it.", "Lovely, that's just the comment I wanted.")

    def first_message(self, task: Task) -> str:
        template = pick(self.openings, self.name, task.id)
        return template.format(question=task.question, student=student_answer(task))

    def checks(self, task: Task, answer: str) -> list[Check]:
        return [
            self._specific(task, answer),
            Check(
                1.0 if WARM.search(answer) else 0.0,
                "Could you make it warmer? Open with an encouraging word like 'Good effort' or 'Nice work'.",
                "Open with an encouraging phrase such as 'Good effort'.",
            ),
            self._gentle(answer),
            self._short(answer),
        ]

    def _specific(self, task: Task, answer: str) -> Check:
        student = student_answer(task)
        met = mentions_answer(answer, student) or mentions_answer(answer, task.answer)
        if student == task.answer:
            return Check(
                1.0 if met else 0.0,
                f"Please make it specific: say that their answer of {student} is right and why.",
                f"Mention the student's answer, {student}, and that it is correct.",
            )
        return Check(
            1.0 if met else 0.0,
            f"Please make it specific: mention that they wrote {student} "
            f"and that the answer is {task.answer}.",
            f"Name the student's answer ({student}) and the correct one ({task.answer}).",
        )

    def _gentle(self, answer: str) -> Check:
        harsh = HARSH.search(answer)
        if harsh is None:
            return Check(1.0, "", "")
        return Check(
            0.0,
            f"Please drop the harsh wording (like '{harsh.group()}'); I don't want to discourage them.",
            "Avoid harsh words such as 'wrong!' or 'careless'.",
        )

    def _short(self, answer: str) -> Check:
        words = word_count(answer)
        return Check(
            length_credit(words, MAX_WORDS, 3 * MAX_WORDS),
            f"It's too long for the margin of a worksheet; keep it to two or three sentences, "
            f"under {MAX_WORDS} words.",
            f"Keep the comment under {MAX_WORDS} words.",
        )
