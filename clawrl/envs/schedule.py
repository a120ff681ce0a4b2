"""The per-turn tool_choice schedule of `--tool-choice` (a clawrl addition to TRL's contract).

    auto                   every answer: the model may call a tool or answer
    required               every answer must call a tool (any of them)
    none                   no tools offered
    calculate,submit       answer 1 must call `calculate`, answer 2 and later `submit`
    required,auto          answer 1 must call a tool, later answers are free

One value for every turn, or a comma list, one per turn, the last repeating. A value
other than auto/required/none names a tool: the request's tool_choice is
`{"type": "function", "function": {"name": NAME}}`. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KEYWORDS = ("auto", "required", "none")


@dataclass(frozen=True)
class Schedule:
    """The tool_choice of each turn (0-based); the last value repeats."""

    values: tuple[str, ...] = ("auto",)

    def at(self, turn: int) -> str:
        """The schedule's value for `turn` (0 is the first answer)."""
        if turn < 0:
            raise ValueError(f"turn must be at least 0, got {turn}")
        return self.values[min(turn, len(self.values) - 1)]

    def tool_choice(self, turn: int) -> str | dict[str, Any]:
        """The request's `tool_choice` for `turn`."""
        value = self.at(turn)
        return value if value in KEYWORDS else {"type": "function", "function": {"name": value}}

    def named(self) -> set[str]:
        """The tool names the schedule forces somewhere."""
        return {v for v in self.values if v not in KEYWORDS}

    def unknown(self, tools: Iterable[str]) -> list[str]:
        """The named tools that are not among `tools`, in schedule order."""
        offered = set(tools)
        return [v for v in dict.fromkeys(self.values) if v not in KEYWORDS and v not in offered]

    def __str__(self) -> str:
        return ",".join(self.values)


def parse_schedule(text: str) -> Schedule:
    """`"calculate,submit"` -> Schedule(("calculate", "submit")); ValueError on an empty item."""
    values = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not v for v in values):
        raise ValueError(f"--tool-choice {text!r}: give auto, required, none or tool names, comma-separated")
    for value in values:
        if value not in KEYWORDS and not value.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"--tool-choice {text!r}: {value!r} is not a tool name")
    return Schedule(values)
