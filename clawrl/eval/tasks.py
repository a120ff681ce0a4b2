"""Evaluation tasks: short problems with one known integer answer, and a train/held-out split.

A task set is a JSONL file shipped in `clawrl/eval/tasks/`, one task a line:

    {"id": "m01", "question": "A baker makes 24 rolls and sells 15 of them. ...", "answer": 9}

`math` holds 48 one- or two-step word problems with small integer answers. They were
written for this project (original text, no third-party data set), so they carry the
project's own licence and nothing else.

Simulated users (clawrl.eval.personas) open one conversation per task; the answer lets
them tell a right answer from a wrong one. `split` sets aside held-out tasks that are
never served during training, so a preference learned on the train tasks can be measured
on problems the model has not been trained on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

TASK_DIR = Path(__file__).with_name("tasks")


@dataclass(frozen=True)
class Task:
    """One problem: a stable id, the question as a user would paste it, and its answer (None in a
    persona's own task file whose checks need none)."""

    id: str
    question: str
    answer: int | None


def task_sets() -> list[str]:
    """Names of the task sets shipped with clawrl."""
    return sorted(p.stem for p in TASK_DIR.glob("*.jsonl"))


def load_tasks(name: str = "math") -> list[Task]:
    """The shipped task set `name`; ValueError naming the known sets otherwise."""
    path = TASK_DIR / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"unknown task set {name!r}; known task sets: {', '.join(task_sets())}")
    return read_tasks(path)


def read_tasks(path: Path, answers: bool = True) -> list[Task]:
    """Tasks from a JSONL file; ValueError naming the line of any malformed or duplicate task.
    With `answers` False a task may leave its answer out (or null): its `answer` is None."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        task = _parse_line(line, where=f"{path}:{number}", answers=answers)
        if task.id in seen:
            raise ValueError(f"{path}:{number}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def _parse_line(line: str, where: str, answers: bool) -> Task:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with id, question and answer")
    task_id, question, answer = row.get("id"), row.get("question"), row.get("answer")
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"{where}: 'id' must be a non-empty string")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string")
    if answer is None:
        if answers:
            raise ValueError(f"{where}: no 'answer' (an integer)")
        return Task(id=task_id, question=question, answer=None)
    # bool is an int subclass; `true` is not an answer.
    if not isinstance(answer, int) or isinstance(answer, bool):
        raise ValueError(f"{where}: 'answer' must be an integer, got {answer!r}")
    return Task(id=task_id, question=question, answer=answer)


def split(tasks: list[Task], held_out: int, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, held_out): `held_out` tasks drawn with `seed`, both lists in the original order.

    The same tasks, count and seed always give the same split.
    """
    if not 0 <= held_out <= len(tasks):
        raise ValueError(f"held_out must be between 0 and {len(tasks)}, got {held_out}")
    chosen = set(random.Random(seed).sample(range(len(tasks)), held_out))
    train = [t for i, t in enumerate(tasks) if i not in chosen]
    kept_out = [t for i, t in enumerate(tasks) if i in chosen]
    return train, kept_out
