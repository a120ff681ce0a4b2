"""Several simulated users on one server (`clawrl eval --users brief,stepwise`): the bookkeeping.

Each simulated user is one persona under its own API key, named after the persona. eval writes the
users file the server is started with (`server.users`, docs/users.md), one generated key per user,
and keeps the admin key (`server.api_key`, generated when the config has none) for `/healthz`'s
details. Pure functions and one file write; the experiment itself is `clawrl.eval.together`.

A user's **line** is the line of versions their requests are served from: their own (`brief/v1`,
...) with an adapter per user (`train.adapters` per_user), or the shared policy's (`v1`, ..., the
`default` user's line) with `shared`. Users on one line share its training steps, so the pacing
budget of a step (`--samples-per-step`, by default `train.batch_size`) is split between them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

from clawrl.eval.personas import is_file_name
from clawrl.types import DEFAULT_USER

USERS_FILE = "users.json"
_NAME = re.compile(r"^[a-z0-9_-]{1,32}$")  # as the users file wants them (clawrl/config/users.py)


def parse_users(text: str, known: list[str]) -> list[str]:
    """`brief,stepwise,mine.toml` -> ["brief", "stepwise", "mine.toml"]: shipped persona names and
    persona files (a .toml name or a path); ValueError for an unknown name or a repeated one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--users names no persona; e.g. --users brief,stepwise")
    unknown = [n for n in names if n not in known and not is_file_name(n)]
    if unknown:
        raise ValueError(
            f"--users: unknown persona {', '.join(unknown)}; known personas: {', '.join(known)} "
            "(or a persona file, FILE.toml)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--users names a persona twice: {text} (each simulated user is one persona)")
    return names


def check_user_names(names: list[str]) -> None:
    """ValueError unless the personas' names (each user is named after theirs) can name users, once
    each."""
    if len(set(names)) != len(names):
        raise ValueError(f"--users: two personas are named alike ({', '.join(names)}); each names a user")
    bad = [n for n in names if not _NAME.match(n) or n == DEFAULT_USER]
    if bad:
        raise ValueError(f"--users: {', '.join(bad)} cannot name a user")


def new_key(name: str) -> str:
    """A fresh API key for the simulated user `name` (never the same twice)."""
    return f"sk-eval-{name}-{secrets.token_hex(12)}"


def write_users_file(folder: Path, keys: dict[str, str]) -> Path:
    """`folder/users.json`, each user's name -> key, readable by its owner only (it holds keys)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / USERS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keys, f, indent=2)
    return path


def line_of(user: str, per_user: bool) -> str:
    """The line of versions `user` is served from: their own with an adapter per user, else the
    shared policy's (the `default` user's)."""
    return user if per_user else DEFAULT_USER


def per_step_share(samples_per_step: int | None, users_on_line: int) -> int | None:
    """One user's share of a step's pacing budget when `users_on_line` users train one line (at least
    1: a shared step then takes a little from each); None (unpaced) stays None."""
    if samples_per_step is None:
        return None
    return max(1, samples_per_step // users_on_line)
