"""The check kinds of a persona file (docs/evaluation.md, "Persona files"): one small pure function each.

A kind measures one reply against one `Rule` (a validated `[[checks]]` table) and returns its
credit in [0, 1] and, for the regex kinds, the text it found (the `{found}` of a complaint):

    max_words      `words`    at most that many words; graded: 1 up to `words`, falling linearly
                              to 0 at 4 x `words`
    min_words      `words`    at least that many words; graded: 1 from `words` on, falling linearly
                              to 0 at a quarter of it
    starts_with    `text`     the reply, leading whitespace stripped, starts with it (case-sensitive)
    ends_with      `text`     the reply, trailing whitespace stripped, ends with it (case-sensitive)
    contains       `text`     the reply contains it (case-sensitive)
    matches        `pattern`  `re.search(pattern, reply)` finds it (no flags: write `(?i)`, `(?m)`)
    not_matches    `pattern`  it does not
    min_lines_matching      `pattern`, `count`   at least `count` lines (`str.splitlines`) in which
                              `re.search` finds the pattern; graded: the share of `count`
    min_sentences_matching  `pattern`, `count`   the same over sentences: pieces cut at a line break,
                              or after ".", "!" or "?" and whitespace before a capital or a digit
    right_number              the reply states the task's answer ("9", "9.0", "nine", "1,200")
    ends_on_number            the last number the reply states is the task's answer
    first_line_has_number     the first non-empty line states a number (any number)
    names_student_answer      the reply states the scripted student's answer (`{student}`) or the
                              task's answer: for personas that quote a student (`teacher`)

Without `partial = true` every kind is met (1) or missed (0): a graded kind's credit counts only
when it is full. right_number, ends_on_number and names_student_answer need each task's answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from clawrl.eval.personas.text import (
    last_number,
    length_credit,
    long_enough_credit,
    mentions_answer,
    numbers_in,
    stable_hash,
    word_count,
)
from clawrl.eval.tasks import Task

ZERO_AT = 4  # max_words' graded credit reaches 0 at this many times `words`


@dataclass(frozen=True)
class Rule:
    """One check of a persona file, validated: its kind, its parameters and what the user says."""

    kind: str
    complaints: tuple[str, ...]  # what the user asks for when it is missed (one picked per task and turn)
    hints: tuple[str, ...]  # the same as a short instruction for explicit feedback
    partial: bool = False  # graded credit where the kind defines it
    words: int | None = None
    text: str | None = None
    pattern: re.Pattern[str] | None = None
    count: int | None = None


@dataclass(frozen=True)
class Measured:
    """A kind's verdict on one reply: credit in [0, 1], and the text a regex kind found."""

    credit: float
    found: str = ""


def student_answer(task: Task) -> int:
    """A scripted student's answer to `task`: right for about half the tasks, else off by 1 to 3
    (fixed per task id; the `{student}` of a persona file)."""
    if task.answer is None:
        raise ValueError(f"task {task.id!r} has no answer, so no scripted student's answer")
    h = stable_hash("teacher", task.id)
    if h % 2 == 0:
        return task.answer
    off = 1 + (h >> 1) % 3
    return task.answer - off if (h >> 3) % 2 and task.answer > off else task.answer + off


def _answer(task: Task) -> int:
    if task.answer is None:  # the loader refuses such tasks for these kinds; this names the trap
        raise ValueError(f"task {task.id!r} has no answer for a check that needs one")
    return task.answer


def _met(ok: bool) -> Measured:
    return Measured(1.0 if ok else 0.0)


def max_words(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.words is not None
    return Measured(length_credit(word_count(reply), rule.words, ZERO_AT * rule.words))


def min_words(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.words is not None
    return Measured(long_enough_credit(word_count(reply), rule.words))


def starts_with(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.text is not None
    return _met(reply.lstrip().startswith(rule.text))


def ends_with(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.text is not None
    return _met(reply.rstrip().endswith(rule.text))


def contains(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.text is not None
    return _met(rule.text in reply)


def matches(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.pattern is not None
    found = rule.pattern.search(reply)
    return Measured(0.0, "") if found is None else Measured(1.0, found.group(0).strip())


def not_matches(rule: Rule, task: Task, reply: str) -> Measured:
    assert rule.pattern is not None
    found = rule.pattern.search(reply)
    return Measured(1.0, "") if found is None else Measured(0.0, found.group(0).strip())


_SENTENCES = re.compile(r"\n+|(?<=[.!?])\s+(?=[A-Z0-9])")


def _share(pieces: list[str], rule: Rule) -> Measured:
    assert rule.pattern is not None and rule.count is not None
    pattern = rule.pattern
    return Measured(min(1.0, sum(1 for p in pieces if pattern.search(p)) / rule.count))


def min_lines_matching(rule: Rule, task: Task, reply: str) -> Measured:
    return _share(reply.splitlines(), rule)


def min_sentences_matching(rule: Rule, task: Task, reply: str) -> Measured:
    return _share(_SENTENCES.split(reply), rule)


def right_number(rule: Rule, task: Task, reply: str) -> Measured:
    return _met(mentions_answer(reply, _answer(task)))


def ends_on_number(rule: Rule, task: Task, reply: str) -> Measured:
    last = last_number(reply)
    return _met(last is not None and abs(last - _answer(task)) < 1e-9)


def first_line_has_number(rule: Rule, task: Task, reply: str) -> Measured:
    lines = [line for line in reply.splitlines() if line.strip()]
    return _met(bool(lines) and bool(numbers_in(lines[0])))


def names_student_answer(rule: Rule, task: Task, reply: str) -> Measured:
    return _met(mentions_answer(reply, student_answer(task)) or mentions_answer(reply, _answer(task)))


@dataclass(frozen=True)
class Kind:
    """A check kind: its function, the parameters it takes (all required) and what it needs."""

    measure: Callable[[Rule, Task, str], Measured]
    params: tuple[str, ...] = ()
    needs_answers: bool = False


KINDS: dict[str, Kind] = {
    "max_words": Kind(max_words, ("words",)),
    "min_words": Kind(min_words, ("words",)),
    "starts_with": Kind(starts_with, ("text",)),
    "ends_with": Kind(ends_with, ("text",)),
    "contains": Kind(contains, ("text",)),
    "matches": Kind(matches, ("pattern",)),
    "not_matches": Kind(not_matches, ("pattern",)),
    "min_lines_matching": Kind(min_lines_matching, ("pattern", "count")),
    "min_sentences_matching": Kind(min_sentences_matching, ("pattern", "count")),
    "right_number": Kind(right_number, needs_answers=True),
    "ends_on_number": Kind(ends_on_number, needs_answers=True),
    "first_line_has_number": Kind(first_line_has_number),
    "names_student_answer": Kind(names_student_answer, needs_answers=True),
}
PARAMS = ("words", "text", "pattern", "count")  # every kind's parameters, for the loader's checks


def measure(rule: Rule, task: Task, reply: str) -> Measured:
    """`rule`'s verdict on `reply`: the kind's credit, graded only with `partial`."""
    measured = KINDS[rule.kind].measure(rule, task, reply)
    if rule.partial or measured.credit >= 1.0:
        return measured
    return Measured(0.0, measured.found)
