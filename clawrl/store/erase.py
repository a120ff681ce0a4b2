"""Erasing a user's data: `clawrl users erase NAME`, `DELETE /v1/users/NAME/data` (docs/users.md,
"Erasing a user's data").

`EraseStore` is mixed into `Store`. `user_rows(user)` counts what an erase would delete;
`erase_user(user)` deletes it, in one transaction, and returns the counts. The rows of `user`:

- `sessions` whose `user` is theirs, and what hangs on those sessions: `turns`, the `feedback`
  and `judgments` of those turns (the admin's rating of one of their answers included: it is about
  their conversation), `episodes` (Track 2);
- `samples` whose `user` is theirs or whose turn is one of theirs;
- `groups` (Track 2) whose every episode was theirs; a group shared with another user's episodes
  stays, with its figures (size, reward mean and spread, sample count) as they were;
- `experiences` (memory) whose `owner` is theirs, with their rows of the full-text index;
- `versions` on their own line (`user`, `alice/vN`): never v0, the base, which every line starts at.

`remove_checkpoints(run_dir, user)` then removes their folder of versions, `checkpoints/<user>/`.
`trained_sample_ids(user)`, read before the erase, and `shared_versions_trained_on(run_dir, ids)`
name the shared policy's versions (the default user's line, `checkpoints/vN`) whose manifest lists
one of the user's samples: their weights learnt from the user and are kept, so the erase says so.
The rows go first: once they are gone nothing names a version in the folder, so a folder that could
not be removed is only disk, and erasing again (the folder alone is found) finishes the job.

Decisions:

- The running totals (`counters`, `reward_by_version`, `reward_by_minute`) follow the deletes
  through m018's DELETE triggers rather than a recount in the same transaction: a recount scans
  every turn, sample and judgment of the run under the write lock (a running server's writes wait
  on it, and past its busy timeout fail), where the triggers cost what is erased, and they keep the
  totals true for any later delete too. The probe's event counts (`memory:distilled`,
  `memory:reactivated`) keep no row to take out: they stay.
- Deleted means gone from the file, not only from the queries: the transaction runs with
  `PRAGMA secure_delete` (SQLite overwrites what it deletes with zeros), the full-text index is
  rebuilt (`optimize`: its old segments held the experiences' words), and the write-ahead log is
  checkpointed and truncated after the commit (best effort: a reader holding an old snapshot keeps
  the log until it lets go; the next checkpoint overwrites it).
- What the user's data taught a shared policy (`train.adapters = "shared"`, or the default user's
  versions) is in those versions' weights, and stays: only the user's own line of versions goes.
- The store does not judge whether the user may be erased (not `default`; no server serving the run
  folder, or that server doing it, `DELETE /v1/users/NAME/data`): the callers do
  (`clawrl/cli/users.py`, `clawrl/api/users.py`). `user_folder` refuses any name that is not
  a user's, so no other folder is ever removed.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.types import DEFAULT_USER
from clawrl.version_folder import CHECKPOINTS, complete_versions, is_user_dir_name, read_manifest

_SESSIONS = "SELECT id FROM sessions WHERE user = ?1"
_TURNS = f"SELECT id FROM turns WHERE session_id IN ({_SESSIONS})"
# Groups with an episode of the user's and none of anyone else's.
_GROUPS = (
    f"id IN (SELECT group_id FROM episodes WHERE session_id IN ({_SESSIONS})) AND NOT EXISTS "
    "(SELECT 1 FROM episodes e JOIN sessions s ON s.id = e.session_id "
    "WHERE e.group_id = groups.id AND s.user != ?1)"
)
# Each kind's rows of the user (?1).
WHERE: dict[str, str] = {
    "sessions": "user = ?1",
    "turns": f"session_id IN ({_SESSIONS})",
    "feedback": f"turn_id IN ({_TURNS})",
    "judgments": f"turn_id IN ({_TURNS})",
    "samples": f"user = ?1 OR turn_id IN ({_TURNS})",
    "episodes": f"session_id IN ({_SESSIONS})",
    "groups": _GROUPS,
    "experiences": "owner = ?1",
    "versions": "user = ?1 AND name != 'v0'",
}
KINDS = tuple(WHERE)
# The order the foreign keys allow deleting them in (groups last: see `delete_rows`).
_ORDER = ("samples", "feedback", "judgments", "episodes", "turns", "sessions", "experiences", "versions")


class EraseStore:
    """A user's rows counted and deleted (mixed into `Store`)."""

    if TYPE_CHECKING:  # provided by Store

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    def user_rows(self, user: str) -> dict[str, int]:
        """How many rows of each kind (`KINDS`) are `user`'s: what `erase_user` would delete."""
        return {k: self._read(f"SELECT count(*) FROM {k} WHERE {WHERE[k]}", (user,))[0][0] for k in KINDS}

    def users_with_rows(self) -> frozenset[str]:
        """Every user with a session, a version of their own or an experience in the store."""
        rows = self._read(
            "SELECT user FROM sessions UNION SELECT user FROM versions UNION SELECT owner FROM experiences"
        )
        return frozenset(r[0] for r in rows if r[0])

    def trained_sample_ids(self, user: str) -> set[int]:
        """The ids of `user`'s samples that a version was trained on (what its manifest lists)."""
        trained = f"SELECT id FROM samples WHERE ({WHERE['samples']}) AND status = 'trained'"
        return {r[0] for r in self._read(trained, (user,))}

    def erase_user(self, user: str) -> dict[str, int]:
        """Delete every row of `user`'s (see the module) in one transaction; the count of each kind."""
        if user == DEFAULT_USER:
            raise ValueError("the default user's rows are the admin's: they are never erased")
        with self._write() as conn:
            was = conn.execute("PRAGMA secure_delete").fetchone()[0]
            conn.execute("PRAGMA secure_delete = ON")
            try:
                erased = delete_rows(conn, user)
            finally:
                conn.execute(f"PRAGMA secure_delete = {int(was)}")
        self._read("PRAGMA wal_checkpoint(TRUNCATE)")
        return erased


def delete_rows(conn: sqlite3.Connection, user: str) -> dict[str, int]:
    """Delete `user`'s rows of every kind, inside the caller's transaction; the count of each kind.

    Groups are picked before their episodes go (afterwards nothing says they were the user's), and
    deleted after them (an episode names its group)."""
    groups = [r[0] for r in conn.execute(f"SELECT id FROM groups WHERE {_GROUPS}", (user,))]
    erased = {
        kind: conn.execute(f"DELETE FROM {kind} WHERE {WHERE[kind]}", (user,)).rowcount for kind in _ORDER
    }
    erased["groups"] = sum(conn.execute("DELETE FROM groups WHERE id = ?", (g,)).rowcount for g in groups)
    if erased["experiences"]:  # rewrite the index: its old segments keep the deleted texts' words
        conn.execute("INSERT INTO experiences_fts (experiences_fts) VALUES ('optimize')")
    return {kind: erased[kind] for kind in KINDS}


def shared_versions_trained_on(run_dir: Path, sample_ids: set[int]) -> list[str]:
    """The default user's versions (the shared policy's line) whose manifest lists one of `sample_ids`,
    oldest first. A pruned version keeps its manifest, so it is named too."""
    if not sample_ids:
        return []
    found = []
    for folder in complete_versions(run_dir):
        try:
            listed = read_manifest(folder).get("samples") or []
        except (OSError, ValueError):  # a manifest that cannot be read names nothing
            continue
        if isinstance(listed, list) and sample_ids.intersection(listed):
            found.append(folder.name)
    return found


def user_folder(run_dir: Path, user: str) -> Path:
    """`checkpoints/<user>/`, where `user`'s own versions live; ValueError for a name that is no
    user's (`default`, whose versions are `checkpoints/vN`, a name like a version, `..`)."""
    if user == DEFAULT_USER or not is_user_dir_name(user):
        raise ValueError(f"{user!r} is not a user's name: 1-32 of a-z, 0-9, _ and -, not default or vN")
    return Path(run_dir) / CHECKPOINTS / user


def remove_checkpoints(run_dir: Path, user: str) -> Path | None:
    """Remove `user`'s folder of versions, with whatever is in it; the folder, or None if there was
    none. OSError if it cannot be removed."""
    folder = user_folder(run_dir, user)
    if not folder.exists() and not folder.is_symlink():
        return None
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink()
    else:
        shutil.rmtree(folder)
    return folder
