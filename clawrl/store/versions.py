"""Published policy versions: the trainer's output and what the server serves.

A version is published in one transaction together with marking the samples
it was trained on `trained`, so a crash between the two can neither lose a
version nor train a sample twice.
The server serves the newest version the canary gate did not hold (the
version watcher, `clawrl/engine/watcher.py`, passes over held ones, as the
trainer does when it picks the version to train on); a held version keeps its
row, status and figures, and is never served. A rollback is a new version
holding a copy of an older checkpoint, so the list only grows.

Each version is on one user's line (m017, docs/users.md): the `default` user's `vN` (a server without
users, the admin key, and every version from before), or a user's own `<user>/vN` when the trainer
keeps an adapter per user (`train.adapters`). The reads take a user (the default user's by default);
every user's line starts at v0, the base model, which a user with no version yet is served.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from clawrl.store.errors import StoreError
from clawrl.store.rows import NOT_DISTILL, REWRITE
from clawrl.types import DEFAULT_USER, Version

_COLUMNS = "name, step, created_at, path, metrics, parent, status, canary"
_NUMBER = "CAST(substr(name, instr(name, '/') + 2) AS INTEGER)"  # N of `vN` and of `alice/vN`


def _version(row: sqlite3.Row) -> Version:
    return Version(
        name=row["name"],
        step=row["step"],
        path=row["path"],
        metrics=json.loads(row["metrics"] or "{}"),
        parent=row["parent"],
        created_at=row["created_at"],
        status=row["status"],
        canary=json.loads(row["canary"]) if row["canary"] else None,
    )


class VersionStore:
    if TYPE_CHECKING:

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    def publish_version(self, version: Version, trained: list[int]) -> None:
        """Record a new version (with its canary status and figures) and mark the samples it was
        trained on `trained`, atomically. A held version's samples are `trained` too: they made it.

        Each of `trained` must be claimed (`training`, `TrainingStore.claim_samples`) or still
        `ready`; otherwise StoreError and nothing is written: a version never says it trained a
        sample whose status says otherwise. Samples of a judgment that landed while the step held
        an earlier sample of the same turn and kind are `skipped`, naming this version (a turn is
        trained on once per kind).

        (Samples left out, stale or skipped, are marked with their reason as soon as they
        are found: `TrainingStore.leave_out_samples`.)
        """
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM versions WHERE name = ?", (version.name,)).fetchone():
                raise StoreError(f"version {version.name} exists already")
            conn.execute(
                f"INSERT INTO versions ({_COLUMNS}, user) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    version.name,
                    version.step,
                    version.created_at,
                    version.path,
                    json.dumps(version.metrics),
                    version.parent,
                    version.status,
                    None if version.canary is None else json.dumps(version.canary),
                    version.user,
                ),
            )
            _mark_trained(conn, version.name, trained)

    def versions(self, user: str | None = DEFAULT_USER) -> list[Version]:
        """`user`'s line of versions, v0 (the base) first; None: every user's, each line in order."""
        if user is None:
            rows = self._read(f"SELECT {_COLUMNS} FROM versions ORDER BY user != 'default', user, {_NUMBER}")
            return [_version(r) for r in rows]
        rows = self._read(
            f"SELECT {_COLUMNS} FROM versions WHERE user = ? OR name = 'v0' ORDER BY {_NUMBER}", (user,)
        )
        return [_version(r) for r in rows]

    def latest_version(self, user: str = DEFAULT_USER) -> Version:
        """`user`'s newest version, held or not (v0, the base, when it has none: the initial migration
        inserts it). Polled by the server, which lists `versions()` only when this changes."""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM versions WHERE user = ? OR name = 'v0' ORDER BY {_NUMBER} DESC LIMIT 1",
            (user,),
        )
        return _version(rows[0])

    def latest_versions(self) -> dict[str, str]:
        """Each user's newest version name, held or not, by user (the users with a version of their own,
        and `default`): one cheap read for the server's watcher of an adapter per user."""
        rows = self._read(
            f"SELECT user, name FROM versions v WHERE {_NUMBER} = "
            f"(SELECT MAX({_NUMBER.replace('name', 'w.name')}) FROM versions w WHERE w.user = v.user)"
        )
        return {r["user"]: r["name"] for r in rows}

    def served_version(self, user: str | None = None) -> str | None:
        """The version the server answered with last: the newest recorded turn's last one (None: no
        turn); with `user`, the newest of that user's turns (an adapter per user: their own line)."""
        if user is None:
            rows = self._read("SELECT versions FROM turns ORDER BY created_at DESC LIMIT 1")
        else:
            rows = self._read(
                "SELECT t.versions FROM turns t JOIN sessions s ON s.id = t.session_id "
                "WHERE s.user = ? ORDER BY t.created_at DESC LIMIT 1",
                (user,),
            )
        versions = json.loads(rows[0]["versions"]) if rows else []
        return versions[-1] if versions else None


_TRAIN = "UPDATE samples SET status = 'trained' WHERE id = ? AND status IN ('training', 'ready')"
# Ready samples of the same turn and kind as the trained sample ?2, from a newer judgment (a memory
# distillation sample is a kind of its own here: one per turn, beside the method's; so is a hint rewrite).
_SKIP_LATER = (
    "UPDATE samples SET status = 'skipped', status_reason = ?1 WHERE status = 'ready' AND id != ?2 "
    f"AND (turn_id, kind, {NOT_DISTILL}, {REWRITE}) = "
    f"(SELECT turn_id, kind, {NOT_DISTILL}, {REWRITE} FROM samples WHERE id = ?2)"
)


def _mark_trained(conn: sqlite3.Connection, version: str, trained: list[int]) -> None:
    ids = list(dict.fromkeys(trained))
    missing = [i for i in ids if not conn.execute(_TRAIN, (i,)).rowcount]
    if missing:
        raise StoreError(f"samples {missing} were neither claimed nor ready: {version} cannot train them")
    reason = f"its turn was trained on (this kind) by {version}, from an earlier judgment"
    conn.executemany(_SKIP_LATER, [(reason, i) for i in ids])
