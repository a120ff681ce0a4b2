"""Simulated users: who talks to the server during an evaluation, and what they prefer.

| name      | opens with                               | prefers                                         |
| --------- | ---------------------------------------- | ----------------------------------------------- |
| `student` | a homework problem, asking for help      | plain prose with the right number, no markdown  |
| `teacher` | a student's answer, asking for a comment | specific, friendly, short grading comments      |
| `brief`   | the bare question                        | the right number in at most 30 words            |
| `pirate`  | a question for the club                  | every answer starting with "Ahoy!" (OPD-only)   |
| `direct`  | the bare question                        | no "To solve this problem, we need to..." opener |
| `autograde` | the question, for a grading script     | a last line that is exactly "Answer: N"         |
| `stepwise` | the question, asking to be walked through | every calculation as a step, at least 60 words |
| `finish`  | the bare question                        | the reply ends on its number, nothing after it  |

`direct`, `autograde` and `finish` are held out: clawrl's defaults are tuned on `brief` only
(`finish` was written for issue 35 and run as written). `stepwise`,
`brief`'s opposite, is for the two-user figures (`clawrl eval --users brief,stepwise`).

All are scripted and deterministic (clawrl.eval.personas.base explains the interface);
`clawrl.eval.llm_persona.LLMPersona` plays any of them with an OpenAI-compatible model.
"""

from __future__ import annotations

from clawrl.eval.personas.autograde import Autograde
from clawrl.eval.personas.base import Check, Persona, Reply, RulePersona
from clawrl.eval.personas.brief import Brief
from clawrl.eval.personas.direct import Direct
from clawrl.eval.personas.finish import Finish
from clawrl.eval.personas.pirate import Pirate
from clawrl.eval.personas.stepwise import Stepwise
from clawrl.eval.personas.student import Student
from clawrl.eval.personas.teacher import Teacher, student_answer
from clawrl.eval.personas.text import mentions_answer, numbers_in
from clawrl.eval.tasks import Task

PERSONAS: dict[str, type[RulePersona]] = {
    p.name: p for p in (Student, Teacher, Brief, Pirate, Direct, Autograde, Stepwise, Finish)
}

PROBE = Task("probe", "What is 2 + 3?", 5)  # any task: a persona's checks exist whatever it is


def get_persona(name: str, max_turns: int = 3) -> RulePersona:
    """A new scripted persona called `name`; ValueError naming the known ones otherwise."""
    try:
        cls = PERSONAS[name]
    except KeyError:
        raise ValueError(f"unknown persona {name!r}; known personas: {', '.join(PERSONAS)}") from None
    persona = cls(max_turns=max_turns)
    if not persona.checks(PROBE, ""):  # its score would divide by nothing, its replies thank everything
        raise ValueError(f"persona {name!r} has no checks: nothing would score or answer its answers")
    return persona


__all__ = [
    "PERSONAS",
    "Check",
    "Persona",
    "Reply",
    "RulePersona",
    "get_persona",
    "mentions_answer",
    "numbers_in",
    "student_answer",
]
