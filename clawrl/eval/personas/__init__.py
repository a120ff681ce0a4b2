"""Simulated users: who talks to the server during an evaluation, and what they prefer.

Every scripted persona is a persona file (docs/evaluation.md, "Persona files"; read by
clawrl.eval.personas.spec, measured by clawrl.eval.personas.checks); these ship with clawrl, as
`clawrl/eval/personas/NAME.toml`, and `clawrl eval --persona NAME` (or `--persona FILE.toml`) runs one:

| name      | opens with                               | prefers                                         |
| --------- | ---------------------------------------- | ----------------------------------------------- |
| `student` | a homework problem, asking for help      | plain prose with the right number, no markdown  |
| `teacher` | a student's answer, asking for a comment | specific, friendly, short grading comments      |
| `brief`   | the bare question                        | any answer in at most 30 words                  |
| `pirate`  | a question for the club                  | every answer starting with "Ahoy!" (OPD-only)   |
| `direct`  | the bare question                        | no "To solve this problem, we need to..." opener |
| `autograde` | the question, for a grading script     | a last line that is exactly "Answer: N"         |
| `stepwise` | the question, asking to be walked through | every calculation as a step, at least 60 words |
| `finish`  | the bare question                        | the reply ends on its number, nothing after it  |

Their checks: `student` five not_matches (bold, lists, headings, labels, LaTeX) and right_number;
`teacher` names_student_answer, matches (a warm word), not_matches (a harsh one) and max_words 60;
`brief` max_words 30; `pirate` starts_with "Ahoy!" and matches "ahoy" anywhere (0.5 for it later
on); `direct` not_matches the opener at the start and anywhere; `autograde` two matches ("Answer: N"
last, 1.0; on a line or "the answer is N" last, 0.5); `stepwise` min_sentences_matching (3
calculations) and min_words 60; `finish` two matches (the last sentence has the number; at most one
sentence after it). Each file's comments say why it is built so.

`direct`, `autograde` and `finish` are held out: clawrl's defaults are tuned on `brief` only
(`finish` was written for issue 35 and run as written). `stepwise`,
`brief`'s opposite, is for the two-user figures (`clawrl eval --users brief,stepwise`).

All are scripted and deterministic (clawrl.eval.personas.base explains the interface);
`clawrl.eval.llm_persona.LLMPersona` plays any of them with an OpenAI-compatible model.
"""

from __future__ import annotations

from pathlib import Path

from clawrl.eval.personas.base import Check, Persona, Reply, RulePersona
from clawrl.eval.personas.checks import student_answer
from clawrl.eval.personas.file import FilePersona, load_persona
from clawrl.eval.personas.spec import PersonaFileError
from clawrl.eval.personas.text import mentions_answer, numbers_in

PERSONA_DIR = Path(__file__).parent
# The shipped persona files, in the order `--help` and error messages list them.
PERSONAS: dict[str, Path] = {
    name: PERSONA_DIR / f"{name}.toml"
    for name in ("student", "teacher", "brief", "pirate", "direct", "autograde", "stepwise", "finish")
}


def is_file_name(name: str) -> bool:
    """Whether `--persona NAME` names a file (FILE.toml, or any path) rather than a shipped persona."""
    return name.endswith(".toml") or "/" in name


def get_persona(name: str, max_turns: int = 3) -> FilePersona:
    """The shipped persona `name`, or the persona file at the path `name` (FILE.toml); ValueError
    naming the known ones for an unknown name, PersonaFileError for a file that cannot be used."""
    if is_file_name(name):
        return load_persona(Path(name), max_turns=max_turns)
    if name not in PERSONAS:
        raise ValueError(
            f"unknown persona {name!r}; known personas: {', '.join(PERSONAS)} (or a persona file, FILE.toml)"
        )
    return load_persona(PERSONAS[name], max_turns=max_turns)


__all__ = [
    "PERSONAS",
    "Check",
    "FilePersona",
    "Persona",
    "PersonaFileError",
    "Reply",
    "RulePersona",
    "get_persona",
    "load_persona",
    "mentions_answer",
    "numbers_in",
    "student_answer",
]
