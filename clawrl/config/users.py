"""The users file (`server.users`, docs/users.md): each user's name and API key, checked at start.

A JSON object mapping each user's name to their API key:

    {"alice": "sk-alice-...", "bob": "sk-bob-..."}

`read_users` returns it as key -> name, or raises `UsersFileError` naming the file and the problem:
the file cannot be read or is not a JSON object of strings to strings; a name that is not 1-32 of
a-z, 0-9, `_` and `-`, or is `default` (the admin key's own user, and the user of every row made
before users were on), or is named like a version (`v12`: `checkpoints/v12/` is the default user's);
a name given twice; a key given to two users, equal to the admin key (`server.api_key`), empty, or
with white space in it (a bearer header could not carry it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clawrl.types import DEFAULT_USER

NAME = re.compile(r"[a-z0-9_-]{1,32}")
VERSION_LIKE = re.compile(r"v[0-9]+")  # a user's versions live in checkpoints/<user>/: not beside vN


class UsersFileError(ValueError):
    """The users file cannot be used; the message names the file and the problem."""


def users_refusal(server: Any) -> str | None:
    """Why `clawrl serve` cannot serve the users file of `server` (the resolved `ServerConfig`,
    which parsed it) (it exits 2 saying so), or None."""
    admin_key = server.api_key.get_secret_value() if server.api_key else None
    if admin_key is None:
        return (
            f"the users file {server.users} needs an admin key: set --server.api-key KEY or $CLAWRL_API_KEY "
            "(the admin key sees every user's records)"
        )
    try:
        keys = server.user_keys
    except UsersFileError as exc:
        return str(exc)
    if admin_key in keys:
        return (
            f"the users file {server.users}: the key of {keys[admin_key]!r} is the admin key (server.api_key)"
        )
    return None


def read_users(path: Path, admin_key: str | None) -> dict[str, str]:
    """The users of `path`, as API key -> name (see the module)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"cannot read the users file {path}: {exc}") from exc
    try:
        return parse_users(text, admin_key)
    except ValueError as exc:
        raise UsersFileError(f"the users file {path}: {exc}") from exc


def parse_users(text: str, admin_key: str | None) -> dict[str, str]:
    """`text`, a JSON object of name -> key, as key -> name; ValueError saying what is wrong."""
    try:
        pairs = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(pairs, _Pairs):
        raise ValueError('must be a JSON object of user names to API keys, {"alice": "KEY", ...}')
    by_key: dict[str, str] = {}
    names: set[str] = set()
    for name, key in pairs:
        _check(name=name, key=key, names=names, by_key=by_key, admin=admin_key)
        names.add(name)
        by_key[key] = name
    return by_key


def _check(name: object, key: object, names: set[str], by_key: dict[str, str], admin: str | None) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"the user name {str(name)[:40]!r} is not 1-32 of a-z, 0-9, _ and -")
    if name == DEFAULT_USER:
        raise ValueError(f"the user name {name!r} is reserved: it is the admin key's own user")
    if VERSION_LIKE.fullmatch(name):
        raise ValueError(f"the user name {name!r} is reserved: it is named like a version (vN)")
    if name in names:
        raise ValueError(f"the user {name!r} is named twice")
    if not isinstance(key, str):
        raise ValueError(f"the key of {name!r} is not a string")
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"the key of {name!r} is empty or has white space in it")
    if key in by_key:
        raise ValueError(f"{by_key[key]!r} and {name!r} have the same key")
    if admin is not None and key == admin:
        raise ValueError(f"the key of {name!r} is the admin key (server.api_key)")


class _Pairs(list):
    """A JSON object as its (name, value) pairs, in order, repeats kept (json.loads would drop them)."""


def _pairs(items: list[tuple[str, object]]) -> _Pairs:
    return _Pairs(items)
