"""The judge's labelled set: (answer, next state, the sign a judge should give), written for the project.

`cases.jsonl` beside this file, one case a line:

    id, category   e.g. "correction-07", one of CATEGORIES
    messages       the conversation before the answer (OpenAI messages)
    answer         the assistant's text; tool_calls: its tool calls (OpenAI shape), or []
    next_state     the user / tool messages that came right after the answer
    label          -1, 0 or +1: what the next state says of the answer

`bench/judge.py` measures judges on it; tests hold the likelihood judge to it. None of its
replies is among the likelihood prompt's own examples (`judge/likelihood.py: USER_EXAMPLES`).

`heldout.jsonl`, same format: complaints about an answer's form, corrections of facts, thanks and
neutral follow-ups in phrasings written before the judge was last tuned and never tuned on
(`bench/judge.py --cases clawrl/judge/heldout.jsonl`); it checks that the judge reads users it
was not shown, where cases.jsonl is what it is tuned on.

`requests.jsonl`, same format, written for issue 53 before the change-request reading was built
and never tuned on: 46 next messages in plain, polite words ("could you ...", "can you ...",
"next time ...") that ask to change the answer just given (more or less of something, another
format, order, tone, language, units, a sign-off), new questions, thanks, and the two mixed
kinds (thanks with a new task, thanks with a change request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from clawrl.types import Message, Turn

CATEGORIES = (
    "correction",
    "complaint",
    "thanks",
    "acceptance",
    "neutral",
    "tool_success",
    "tool_error",
    "tool_outage",
    "injection",
    "other_language",
    "change_request",  # requests.jsonl: a polite request to change the answer just given
    "new_question",  # requests.jsonl: a new task, no verdict on the answer
    "mixed",  # requests.jsonl: thanks with a new task (+1), or thanks with a change request (-1)
)
REQUEST_CATEGORIES = ("change_request", "new_question", "mixed")  # requests.jsonl's own


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    messages: list[Message]
    answer: str
    tool_calls: list[dict[str, Any]]
    next_state: list[Message]
    label: int

    def turn(self) -> Turn:
        """The case as the recorded turn a judge reads (its token fields are empty: judges read text)."""
        return Turn(
            id=f"case-{self.id}",
            session_id=f"cases-{self.id}",
            index=0,
            turn_type="main",
            messages=self.messages,
            tools=None,
            prompt_ids=[],
            response_ids=[],
            logprobs=[],
            response_text=self.answer,
            tool_calls=self.tool_calls,
            finish_reason="tool_calls" if self.tool_calls else "stop",
            versions=["v0"],
            temperature=1.0,
            created_at=0.0,
            finished_at=0.0,
            next_state=self.next_state,
        )


def load_cases(path: Path | None = None) -> list[Case]:
    """Every case of the shipped set (or of `path`, same format), checked as it is read (a bad row
    raises ValueError naming it)."""
    source = files("clawrl.judge") / "cases.jsonl" if path is None else path
    name = "cases.jsonl" if path is None else str(path)
    text = source.read_text(encoding="utf-8")
    cases = [_case(line, n, name) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if len({c.id for c in cases}) != len(cases):
        raise ValueError(f"{name}: two cases share an id")
    return cases


def load_heldout() -> list[Case]:
    """The held-out set (`heldout.jsonl` beside this file): replies no prompt shows and no tuning saw."""
    return load_cases(Path(str(files("clawrl.judge") / "heldout.jsonl")))


def load_requests() -> list[Case]:
    """The change-request set (`requests.jsonl` beside this file), written before the reading it checks."""
    return load_cases(Path(str(files("clawrl.judge") / "requests.jsonl")))


def _case(line: str, n: int, name: str = "cases.jsonl") -> Case:
    try:
        row = json.loads(line)
        case = Case(
            id=str(row["id"]),
            category=row["category"],
            messages=list(row["messages"]),
            answer=str(row.get("answer") or ""),
            tool_calls=list(row.get("tool_calls") or []),
            next_state=list(row["next_state"]),
            label=int(row["label"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{name} line {n}: {exc}") from exc
    if case.category not in CATEGORIES or case.label not in (-1, 0, 1) or not case.next_state:
        raise ValueError(f"{name} line {n} ({case.id}): bad category, label or empty next state")
    return case
