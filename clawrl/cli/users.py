"""`clawrl users erase NAME`: delete a user's data from a run folder (docs/users.md).

The command parses, refuses, asks and prints; the store deletes (`clawrl/store/erase.py`, which
says what is deleted and why the running totals stay true). Two ways, by whether a server runs:

- a server serves the run folder (it holds `server.lock`, clawrl/store/locks.py), or `--server URL`
  names one: the erase goes through it, `DELETE /v1/users/NAME/data` with the admin key from
  `$CLAWRL_API_KEY` (clawrl/api/users.py), so its engine, sessions and trainer forget the user too.
  Without `--server`, its address is the run's config.json's (`server.host`, `server.port`: the
  running server wrote it);
- no server: the command takes `server.lock` itself (a server starting meanwhile is refused), deletes
  the rows in one transaction, then removes `checkpoints/NAME/`. A user still in the users file is
  served from v0 at the next start.

Either way it prints the shared policy's versions that were trained on the user's samples (kept:
their weights learnt from them). Refused (exit 2, nothing deleted):

- `default`, the admin key's own user (every row from before users were on is theirs too), and a
  name that cannot be a user's;
- a run folder with no clawrl.db; a users file (the one config.json names) that cannot be read;
- a name that is no user of the users file and has nothing in the store nor a folder of versions:
  the message names the users;
- without `--yes`, a standard input that is not a terminal (nobody can be asked);
- the server's refusal (its key is not the admin's, it is unreachable), with its message.

Otherwise it shows what the user has, asks "erase all of NAME's data from DIR? [y/N]" (anything but
y or yes erases nothing: exit 1), erases, and prints what went. It cannot be undone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from clawrl.cli.common import fail
from clawrl.types import DEFAULT_USER

ERASE_TIMEOUT_S = 300.0  # the server stops and restarts its trainer around the erase


def add_users_parser(sub: Any) -> None:
    users = sub.add_parser(
        "users",
        help="erase a user's data (docs/users.md)",
        description="Work on the users of a run folder's store (server.users, docs/users.md).",
    )
    actions = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    erase = actions.add_parser(
        "erase",
        help="delete every record, memory and version of a user",
        description="Delete NAME's sessions, turns, ratings, judgments, samples, episodes, experiences "
        "and versions, and their checkpoints/NAME/ folder: through the server when one serves the run "
        "folder (the admin key from $CLAWRL_API_KEY), else in the store directly. A user who stays in "
        "the users file goes on from v0. It cannot be undone.",
    )
    erase.add_argument("name", help="the user's name, as in the users file")
    erase.add_argument("--yes", action="store_true", help="erase without asking")
    erase.add_argument("--run-dir", type=Path, default=Path("clawrl-run"), help="default ./clawrl-run")
    erase.add_argument(
        "--server",
        metavar="URL",
        help="erase through the server at URL (http://HOST:PORT); default: the one serving --run-dir, if any",
    )
    erase.set_defaults(direct=cmd_users)


def cmd_users(args: argparse.Namespace) -> int:
    """`clawrl users erase`: the refusals, the question, the erase, what went (see the module)."""
    from clawrl.store.db import Store, StoreError
    from clawrl.store.erase import user_folder
    from clawrl.store.locks import SERVER_LOCK, FolderLocked, hold

    name, run_dir = args.name, args.run_dir
    db = run_dir / "clawrl.db"
    if refused := _refusal(name, run_dir):
        return fail(refused)
    if not args.yes and not sys.stdin.isatty():
        return fail(f"standard input is not a terminal, so nobody can confirm: give --yes to erase {name}")
    try:
        users = _file_users(run_dir)
    except ValueError as exc:
        return fail(f"{exc}: cannot read the users of {run_dir}")
    folder = user_folder(run_dir, name)
    lock, server = None, args.server
    if server is None:
        try:
            lock = hold(run_dir, SERVER_LOCK, "clawrl serve")  # no server starts while we erase
        except FolderLocked as exc:
            server = _server_url(run_dir)
            print(f"a server (pid {exc.pid or 'unknown'}) serves {run_dir}: erasing through it at {server}")
    try:
        with Store.open(db, readonly=True) as store:
            rows, stored = store.user_rows(name), store.users_with_rows()
        if name not in users and not any(rows.values()) and not folder.exists():
            known = ", ".join(sorted((users | stored) - {DEFAULT_USER})) or "none"
            return fail(f"no user {name} in {db} (the users: {known})")
        print(f"{name}'s data in {run_dir}: {_summary(rows)}{_folder_note(folder)}")
        if not args.yes and not _confirmed(f"erase all of {name}'s data from {run_dir}? [y/N] "):
            print("nothing erased")
            return 1
        if server is not None:
            return _erase_through(server, name)
        with Store.open(db) as store:
            trained = store.trained_sample_ids(name)
            erased = store.erase_user(name)
    except StoreError as exc:
        return fail(str(exc))
    finally:
        if lock is not None:
            lock.close()
    return _remove_folder(run_dir, name, erased, trained)


def _refusal(name: str, run_dir: Path) -> str | None:
    """Why `name`'s data in `run_dir` cannot be erased, before the store is opened; None: it may be."""
    from clawrl.store.erase import user_folder

    if name == DEFAULT_USER:
        return f"{DEFAULT_USER} is the admin key's own user (and every row from before users): never erased"
    try:
        user_folder(run_dir, name)
    except ValueError as exc:
        return str(exc)
    if not (run_dir / "clawrl.db").is_file():
        return f"no clawrl.db in {run_dir} (is it a clawrl run folder?)"
    return None


def _file_users(run_dir: Path) -> frozenset[str]:
    """The users of the users file the run's config.json names (`server.users`); none without one.
    ValueError when config.json or the users file cannot be read."""
    from clawrl.config.users import UsersFileError, read_users

    users_file = _run_config(run_dir).get("users")
    if not users_file:
        return frozenset()
    try:  # a relative path is read from the current folder, as `clawrl serve` read it
        return frozenset(read_users(Path(users_file).expanduser(), None).values())
    except UsersFileError as exc:
        raise ValueError(str(exc)) from exc


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The `server` section of the run's config.json ({} without one)."""
    config = run_dir / "config.json"
    if not config.is_file():
        return {}
    try:
        server = json.loads(config.read_text(encoding="utf-8")).get("server", {})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"cannot read {config}: {exc}") from exc
    return server if isinstance(server, dict) else {}


def _server_url(run_dir: Path) -> str:
    """The address of the server serving `run_dir`, from the config.json it wrote at start."""
    server = _run_config(run_dir)
    host = str(server.get("host") or "127.0.0.1")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # a wildcard bind: reach it locally
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{server.get('port', 8000)}"


def _erase_through(server: str, name: str) -> int:
    """`DELETE /v1/users/NAME/data` on `server` with the admin key ($CLAWRL_API_KEY); prints what went."""
    import httpx

    key = os.environ.get("CLAWRL_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{server.rstrip('/')}/v1/users/{name}/data"
    try:
        response = httpx.delete(url, headers=headers, timeout=ERASE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return fail(f"cannot reach the server at {server}: {exc}")
    if response.status_code != 200:
        try:
            why = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = response.text[:300]
        return fail(f"the server refused ({response.status_code}): {why}")
    body = response.json()
    print(f"erased {name}'s rows through {server}: {_summary(body['erased'])}")
    if body.get("checkpoints_removed"):
        print(f"removed {name}'s versions folder")
    if body.get("served"):
        print(f"{name} is served {body['served']} from now on")
    _print_shared(body.get("shared_versions") or [])
    return 0


def _confirmed(question: str) -> bool:
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _summary(rows: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in rows.items())


def _folder_note(folder: Path) -> str:
    return f", and the folder {folder}" if folder.exists() else ""


def _print_shared(shared: list[str]) -> None:
    if shared:
        print(
            f"kept: the shared policy's versions {', '.join(shared)} were trained on their samples "
            "(their weights learnt from them; roll back before them to serve a policy without)"
        )


def _remove_folder(run_dir: Path, name: str, erased: dict[str, int], trained: set[int]) -> int:
    from clawrl.store.erase import remove_checkpoints, shared_versions_trained_on

    print(f"erased {name}'s rows from {run_dir / 'clawrl.db'}: {_summary(erased)}")
    _print_shared(shared_versions_trained_on(run_dir, trained))
    try:
        removed = remove_checkpoints(run_dir, name)
    except OSError as exc:
        return fail(f"could not remove {name}'s versions folder: {exc}; remove it by hand")
    if removed is not None:
        print(f"removed {removed}")
    return 0
