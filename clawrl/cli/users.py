"""`clawrl users erase NAME`: delete a removed user's data from a run folder (docs/users.md).

The command parses, refuses, asks and prints; the store deletes (`clawrl/store/erase.py`, which
says what is deleted and why the running totals stay true). Refused (exit 2, nothing deleted):

- `default`, the admin key's own user (every row from before users were on is theirs too), and a
  name that cannot be a user's;
- a run folder with no clawrl.db;
- a user still in the users file the run folder's config.json names (`server.users`, as the last
  `clawrl serve` started with it): they must be removed from it first, and the server restarted,
  or it goes on serving and recording them; a users file that cannot be read (nothing says the user
  left it);
- a name with nothing in the store and no folder of versions;
- without `--yes`, a standard input that is not a terminal (nobody can be asked).

Otherwise it shows what the user has, asks "erase all of NAME's data from DIR? [y/N]" (anything but
y or yes erases nothing: exit 1), deletes the rows in one transaction, then removes
`checkpoints/NAME/`, and prints what it erased. It cannot be undone. It may run beside a server
(one write transaction, as `clawrl memory forget`); the server must have been restarted without the
user.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clawrl.cli.common import fail
from clawrl.types import DEFAULT_USER


def add_users_parser(sub: Any) -> None:
    users = sub.add_parser(
        "users",
        help="erase a removed user's data (docs/users.md)",
        description="Work on the users of a run folder's store (server.users, docs/users.md).",
    )
    actions = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    erase = actions.add_parser(
        "erase",
        help="delete every record, memory and version of a user removed from the users file",
        description="Delete, in one transaction, NAME's sessions, turns, ratings, judgments, samples, "
        "episodes, experiences and versions, then their checkpoints/NAME/ folder. NAME must have been "
        "removed from the users file first. It cannot be undone.",
    )
    erase.add_argument("name", help="the user's name, as it was in the users file")
    erase.add_argument("--yes", action="store_true", help="erase without asking")
    erase.add_argument("--run-dir", type=Path, default=Path("clawrl-run"), help="default ./clawrl-run")
    erase.set_defaults(direct=cmd_users)


def cmd_users(args: argparse.Namespace) -> int:
    """`clawrl users erase`: the refusals, the question, the erase, what went (see the module)."""
    from clawrl.store.db import Store, StoreError
    from clawrl.store.erase import user_folder

    name, run_dir = args.name, args.run_dir
    db = run_dir / "clawrl.db"
    if refused := _refusal(name, run_dir):
        return fail(refused)
    if not args.yes and not sys.stdin.isatty():
        return fail(f"standard input is not a terminal, so nobody can confirm: give --yes to erase {name}")
    folder = user_folder(run_dir, name)
    try:
        with Store.open(db) as store:
            rows = store.user_rows(name)
            if not any(rows.values()) and not folder.exists():
                return fail(f"no user {name} in {db}")
            print(f"{name}'s data in {run_dir}: {_summary(rows)}{_folder_note(folder)}")
            if not args.yes and not _confirmed(f"erase all of {name}'s data from {run_dir}? [y/N] "):
                print("nothing erased")
                return 1
            erased = store.erase_user(name)
    except StoreError as exc:
        return fail(str(exc))
    return _remove_folder(run_dir, name, erased)


def _refusal(name: str, run_dir: Path) -> str | None:
    """Why `name`'s data in `run_dir` cannot be erased, before the store is opened; None: it may be."""
    from clawrl.config.users import UsersFileError, read_users
    from clawrl.store.erase import user_folder

    if name == DEFAULT_USER:
        return f"{DEFAULT_USER} is the admin key's own user (and every row from before users): never erased"
    try:
        user_folder(run_dir, name)
    except ValueError as exc:
        return str(exc)
    if not (run_dir / "clawrl.db").is_file():
        return f"no clawrl.db in {run_dir} (is it a clawrl run folder?)"
    try:
        users_file = _users_file(run_dir)
        if users_file is not None and name in read_users(users_file, None).values():
            return (
                f"{name} is still in the users file {users_file}: remove their line and restart "
                "clawrl serve first (docs/users.md, Removing a user)"
            )
    except (UsersFileError, ValueError) as exc:
        return f"{exc}: cannot check that {name} was removed from the users file"
    return None


def _users_file(run_dir: Path) -> Path | None:
    """The users file the run's config.json names (`server.users`), or None (no users, no config).
    A relative path is read from the current folder, as `clawrl serve` read it."""
    config = run_dir / "config.json"
    if not config.is_file():
        return None
    try:
        users = json.loads(config.read_text(encoding="utf-8")).get("server", {}).get("users")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"cannot read {config}: {exc}") from exc
    return Path(users).expanduser() if users else None


def _confirmed(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _summary(rows: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in rows.items())


def _folder_note(folder: Path) -> str:
    return f", and the folder {folder}" if folder.exists() else ""


def _remove_folder(run_dir: Path, name: str, erased: dict[str, int]) -> int:
    from clawrl.store.erase import remove_checkpoints

    print(f"erased {name}'s rows from {run_dir / 'clawrl.db'}: {_summary(erased)}")
    try:
        removed = remove_checkpoints(run_dir, name)
    except OSError as exc:
        return fail(f"could not remove {name}'s versions folder: {exc}; remove it by hand")
    if removed is not None:
        print(f"removed {removed}")
    return 0
