"""Per-user figures (docs/users.md): the dashboard's users table and /metrics' `user` label.

`user_rows` turns the store's per-figure counts (`Store.per_user`: one grouped query a figure,
never one a user) and each user's served version into one `UserRow` a user, busiest first.
`top_users` keeps /metrics' label values bounded: the `TOP_USERS` busiest users by turns, the
rest summed into one row named `other`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

TOP_USERS = 20  # /metrics: users with a label value of their own; the rest are `user="other"`
OTHER = "other"


@dataclass(frozen=True)
class UserRow:
    """One user's figures: traffic, samples by status, versions published and held, memory."""

    user: str
    served: str  # the version the user's new requests get ("" for `other`: several)
    turns: int = 0
    ready: int = 0  # samples waiting for the trainer
    trained: int = 0
    skipped: int = 0
    versions: int = 0  # published on the user's line, v0 excluded
    held: int = 0  # versions the canary gate held back
    memory: int = 0  # experiences not retired


def user_rows(users: Iterable[str], figures: dict[str, Any], served: Callable[[str], str]) -> list[UserRow]:
    """A row for each of `users` and each user the store has figures for, most turns first."""
    names = set(users)
    for figure in figures.values():
        names |= set(figure)
    rows = [_row(name, figures, served(name)) for name in names]
    return sorted(rows, key=lambda r: (-r.turns, r.user))


def _row(name: str, figures: dict[str, Any], served: str) -> UserRow:
    samples = figures["samples"].get(name, {})
    versions = figures["versions"].get(name, {})
    return UserRow(
        user=name,
        served=served,
        turns=figures["turns"].get(name, 0),
        ready=samples.get("ready", 0),
        trained=samples.get("trained", 0),
        skipped=samples.get("skipped", 0),
        versions=sum(versions.values()),
        held=versions.get("held", 0),
        memory=figures["memory"].get(name, 0),
    )


def top_users(rows: list[UserRow], n: int = TOP_USERS) -> list[UserRow]:
    """The `n` busiest of `rows` (sorted, as `user_rows` gives them) and the rest summed as `other`."""
    top, rest = rows[:n], rows[n:]
    if not rest:
        return top
    summed = {key: sum(getattr(r, key) for r in rest) for key in _SUMMED}
    return [*top, UserRow(OTHER, "", **summed)]


_SUMMED = ("turns", "ready", "trained", "skipped", "versions", "held", "memory")
