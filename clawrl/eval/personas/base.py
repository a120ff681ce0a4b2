"""The simulated-user interface, and the machinery of the rule-based (scripted) personas.

A persona plays one user through one conversation per task:

    first_message(task)            the opening user message
    score(task, answer)   -> float how well one assistant answer meets the user's preference, in [0, 1]
    reply(task, answer, turn)      the user's next move after the `turn`-th answer (1-based)

`Reply.message` is what the user sends next: the next state the server's judge learns
from. Unsatisfied, it names what to change; satisfied, it thanks. `Reply.comment` is a
short hindsight hint for explicit thumbs-down feedback (`POST /v1/feedback`), `rating`
the thumbs (+1 / -1). The conversation is over (`done`) after an accepted answer or
after `max_turns` answers; a driver delivers the last message as the session's closing
next state and/or the rating and comment as explicit feedback.

A `RulePersona` is a list of `Check`s, each worth a value in [0, 1]: its score is their
mean, it accepts an answer only when every check is fully met, and its complaint is
built from the checks it missed. Its thumbs go up from a score of `GOOD_ENOUGH` (0.5)
on, as a real user rates a decent answer up while still asking for more: an answer
that is better than most gets a positive reward even when the model cannot yet meet
the whole preference (with thumbs up only for perfect answers, a small model earned
almost only -1s, and RL had nothing to contrast). Everything is a pure function of (task, answer, turn).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from clawrl.eval.personas.text import pick
from clawrl.eval.tasks import Task


@dataclass(frozen=True)
class Reply:
    """The user's move after one answer."""

    message: str | None  # the next user message; None when the user leaves without a word
    rating: int  # +1 good enough (score >= GOOD_ENOUGH), -1 not
    comment: str | None  # a short hint for explicit thumbs-down feedback; None when satisfied
    done: bool  # the conversation ends here


class Persona(Protocol):
    """A simulated user. Scripted personas and `LLMPersona` both implement this."""

    name: str
    description: str
    max_turns: int

    def first_message(self, task: Task) -> str: ...

    def score(self, task: Task, answer: str) -> float: ...

    def reply(self, task: Task, answer: str, turn: int) -> Reply: ...


@dataclass(frozen=True)
class Check:
    """One rule of a persona's preference applied to one answer."""

    value: float  # 1.0 met, 0.0 missed, in between: partial credit
    complaint: str  # what the user asks for when it is not met
    hint: str  # the same, as a short instruction for explicit feedback

    @property
    def met(self) -> bool:
        return self.value >= 1.0


GOOD_ENOUGH = 0.5  # thumbs up from this score on, even while still asking for more


class RulePersona:
    """A scripted persona: a subclass (`clawrl.eval.personas.file.FilePersona`) sets `name`,
    `description`, `openings` and defines `checks`."""

    name: str
    description: str
    openings: tuple[str, ...]  # first-message templates with a {question} field
    thanks: tuple[str, ...] = ("Thanks, that's perfect.", "Great, that's exactly what I needed.")
    give_up: str = "Never mind, I'll sort it out myself."

    def __init__(self, max_turns: int = 3) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns

    def checks(self, task: Task, answer: str, turn: int = 1) -> list[Check]:
        """Each check on `answer`; `turn` only picks the wording of the complaints."""
        raise NotImplementedError

    def first_message(self, task: Task) -> str:
        return pick(self.openings, self.name, task.id).format(question=task.question)

    def score(self, task: Task, answer: str) -> float:
        checks = self.checks(task, answer)
        return min(1.0, max(0.0, sum(c.value for c in checks) / len(checks)))

    def reply(self, task: Task, answer: str, turn: int) -> Reply:
        if turn < 1:
            raise ValueError(f"turn counts answers from 1, got {turn}")
        missed = [c for c in self.checks(task, answer, turn) if not c.met]
        if not missed:
            return Reply(pick(self.thanks, task.id, turn), rating=1, comment=None, done=True)
        message, hint = self.complain(missed)
        done = turn >= self.max_turns
        if done:
            message = f"{message} {self.give_up}"
        rating = 1 if self.score(task, answer) >= GOOD_ENOUGH else -1
        return Reply(message, rating=rating, comment=hint, done=done)

    def complain(self, missed: list[Check]) -> tuple[str, str]:
        """(message, hint) asking for every missed check, each distinct text once (two checks that
        grade one preference, as a full and a partial step, may say the same)."""
        return _joined(c.complaint for c in missed), _joined(c.hint for c in missed)


def _joined(texts: Iterable[str]) -> str:
    return " ".join(dict.fromkeys(t for t in texts if t))
