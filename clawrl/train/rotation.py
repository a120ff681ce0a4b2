"""Whose adapter the next step trains, with an adapter per user (`train.adapters`, docs/users.md).

A step trains one user's ready samples. Users are taken in turn: after `last`, the next user by
name that has a full batch ready (`batch_size` samples), wrapping round, so a user with a full
batch waits for at most one step of every other user and is never starved by a busier one. A user
with fewer ready samples than a batch waits, as the one policy waits without users.
Pure: the counts come from the store (`TrainingStore.ready_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping


def next_user(ready: Mapping[str, int], batch_size: int, last: str | None) -> str | None:
    """The user whose samples the next step trains, or None when no user has a full batch ready.

    `ready`: each user's ready samples; `last`: the user the previous step (or try) was for."""
    due = sorted(user for user, n in ready.items() if n >= batch_size)
    if not due:
        return None
    after = [user for user in due if last is not None and user > last]
    return after[0] if after else due[0]
