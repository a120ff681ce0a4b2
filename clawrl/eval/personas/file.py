"""A persona read from a file: `load_persona(path)` and the `FilePersona` it makes.

A `FilePersona` is a `RulePersona` whose checks are a persona file's `[[checks]]` (clawrl.eval.personas
.spec reads it, clawrl.eval.personas.checks measures): its score is their mean, it thanks when every
check is met, and it complains with each missed check's complaint, picked per task and turn. It also
carries its tasks (the file's `tasks`: a shipped set, or a JSONL file beside it) and the file's
path and sha256, which the eval report names so a figure can be reproduced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.personas.checks import Rule, measure, student_answer
from clawrl.eval.personas.spec import PersonaFileError, PersonaSpec, needs_answers, parse
from clawrl.eval.personas.text import pick, word_count
from clawrl.eval.tasks import TASK_DIR, Task, read_tasks


class FilePersona(RulePersona):
    """A scripted persona whose preference is a persona file's checks."""

    def __init__(self, spec: PersonaSpec, rules: list[Rule], source: Source, max_turns: int = 3) -> None:
        super().__init__(max_turns)
        self.name, self.description = spec.name, spec.description
        self.openings, self.thanks, self.give_up = tuple(spec.openings), tuple(spec.thanks), spec.give_up
        self.rules = rules
        self.source = source
        self.tasks = source.tasks

    def first_message(self, task: Task) -> str:
        return pick(self.openings, self.name, task.id).format_map(_fields(task))

    def checks(self, task: Task, answer: str, turn: int = 1) -> list[Check]:
        return [
            self._check(index=i, rule=rule, task=task, answer=answer, turn=turn)
            for i, rule in enumerate(self.rules)
        ]

    def _check(self, index: int, rule: Rule, task: Task, answer: str, turn: int) -> Check:
        measured = measure(rule, task, answer)
        if measured.credit >= 1.0:
            return Check(1.0, "", "")
        fields = _fields(task) | {"words": word_count(answer), "found": measured.found}
        complaint = pick(rule.complaints, self.name, task.id, turn, index).format_map(fields)
        hint = pick(rule.hints, self.name, task.id, turn, index).format_map(fields)
        return Check(measured.credit, complaint, hint)


def _fields(task: Task) -> dict[str, object]:
    """The task's `{question}`, and `{answer}` and `{student}` when it has an answer (the loader
    refuses a file whose texts use them with tasks that have none)."""
    fields: dict[str, object] = {"question": task.question}
    if task.answer is not None:
        fields |= {"answer": task.answer, "student": student_answer(task)}
    return fields


@dataclass(frozen=True)
class Source:
    """Where a persona came from: its file, the file's sha256, and its tasks."""

    path: Path
    sha256: str
    tasks_name: str  # the file's `tasks` as written
    tasks: list[Task]

    def as_json(self) -> dict[str, str]:
        return {"path": str(self.path.resolve()), "sha256": self.sha256, "tasks": self.tasks_name}


def load_persona(path: Path, max_turns: int = 3) -> FilePersona:
    """The persona in the TOML file at `path`; PersonaFileError naming the file and the spot."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PersonaFileError(f"persona file {path}: cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PersonaFileError(f"persona file {path}: not UTF-8 text") from None
    spec, rules = parse(path, text)
    needer = needs_answers(spec, rules)
    tasks_path = resolve_tasks(path, spec.tasks)
    try:
        tasks = read_tasks(tasks_path, answers=needer is not None)
    except ValueError as exc:
        needs = f" ({needer} needs each task's answer)" if needer else ""
        raise PersonaFileError(f"persona file {path}: tasks {spec.tasks!r}: {exc}{needs}") from None
    if not tasks:
        raise PersonaFileError(f"persona file {path}: tasks {spec.tasks!r}: {tasks_path} holds no task")
    source = Source(path, hashlib.sha256(raw).hexdigest(), spec.tasks, tasks)
    return FilePersona(spec, rules, source, max_turns=max_turns)


def resolve_tasks(persona_path: Path, tasks: str) -> Path:
    """A JSONL path (it ends in .jsonl or names a folder) relative to the persona file; else a
    shipped task set's file. PersonaFileError when neither is there."""
    if tasks.endswith(".jsonl") or "/" in tasks:
        path = persona_path.parent / tasks
        if not path.is_file():
            raise PersonaFileError(f"persona file {persona_path}: tasks file {path} does not exist")
        return path
    path = TASK_DIR / f"{tasks}.jsonl"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TASK_DIR.glob("*.jsonl")))
        raise PersonaFileError(
            f"persona file {persona_path}: unknown task set {tasks!r}; known task sets: {known} "
            "(or a .jsonl path relative to the persona file)"
        )
    return path
