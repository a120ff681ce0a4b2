"""Episodes and groups (Track 2): the environment runner's half of the store.

`EpisodeStore` is mixed into `Store`. The rules it keeps:

- An episode is one session; it is recorded once (`EpisodeConflict` the second
  time) and only for a session the store knows (`UnknownSession`).
- A group is created by its first episode, with that episode's size `G`; an
  episode naming another size is refused (`EpisodeConflict`).
- A group is closed once: `close_group` writes the group's samples and its
  status (`used` or `dropped`, with the reason) in one transaction, and does
  nothing for a group that is no longer open, so a retry never trains twice.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from clawrl.store.errors import EpisodeConflict, UnknownSession
from clawrl.store.rows import INSERT_SAMPLE, dumps, loads, sample_row
from clawrl.types import GROUP_OPEN, Episode, Group, Sample

_EPISODE_FIELDS = (
    "session_id, group_id, task, env, reward, status, reason, turns, tool_calls, info, train, created_at"
)
_EPISODE_E = ", ".join(f"e.{name}" for name in _EPISODE_FIELDS.split(", "))
_GROUP_FIELDS = "id, size, task, env, status, reason, reward_mean, reward_std, samples, created_at, closed_at"
_RECEIVED = "(SELECT count(*) FROM episodes e WHERE e.group_id = groups.id) AS received"


class EpisodeStore:
    """Episodes and their groups of one run (mixed into `Store`)."""

    if TYPE_CHECKING:  # provided by Store

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    def record_episode(self, ep: Episode) -> Group:
        """Record one finished episode (and its group, the first time); returns the group as it now is."""
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (ep.session_id,)).fetchone() is None:
                raise UnknownSession(f"no session {ep.session_id!r} was recorded")
            if conn.execute("SELECT 1 FROM episodes WHERE session_id = ?", (ep.session_id,)).fetchone():
                raise EpisodeConflict(f"the episode of session {ep.session_id!r} was already recorded")
            _ensure_group(conn, ep)
            ep.id = int(
                conn.execute(
                    f"INSERT INTO episodes ({_EPISODE_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        ep.session_id,
                        ep.group_id,
                        ep.task,
                        ep.env,
                        ep.reward,
                        ep.status,
                        ep.reason,
                        ep.turns,
                        ep.tool_calls,
                        dumps(ep.info),
                        int(ep.train),
                        ep.created_at,
                    ),
                ).lastrowid
                or 0
            )
            return _group(conn, ep.group_id)

    def group(self, group_id: str) -> Group | None:
        rows = self._read(f"SELECT {_GROUP_FIELDS}, {_RECEIVED} FROM groups WHERE id = ?", (group_id,))
        return _group_from_row(rows[0]) if rows else None

    def group_episodes(self, group_id: str) -> list[Episode]:
        """The group's episodes, in the order they were recorded."""
        rows = self._read(
            f"SELECT e.id, {_EPISODE_E}, g.size FROM episodes e JOIN groups g ON g.id = e.group_id "
            "WHERE e.group_id = ? ORDER BY e.id",
            (group_id,),
        )
        return [_episode_from_row(row) for row in rows]

    def complete_open_groups(self) -> list[str]:
        """Groups still open though every episode is in (the server stopped before closing them)."""
        rows = self._read(
            f"SELECT id, size, {_RECEIVED} FROM groups WHERE status = ? ORDER BY created_at", (GROUP_OPEN,)
        )
        return [row["id"] for row in rows if row["received"] >= row["size"]]

    def close_group(
        self,
        group_id: str,
        status: str,
        reason: str | None,
        stats: tuple[float | None, float | None],
        samples: list[Sample],
    ) -> bool:
        """Write the group's samples and its verdict at once; False (nothing written) if already closed."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE groups SET status = ?, reason = ?, reward_mean = ?, reward_std = ?, samples = ?, "
                "closed_at = ? WHERE id = ? AND status = ?",
                (status, reason, *stats, len(samples), time.time(), group_id, GROUP_OPEN),
            )
            if cur.rowcount != 1:
                return False
            for sample in samples:
                sample.id = int(conn.execute(INSERT_SAMPLE, sample_row(sample)).lastrowid or 0)
        return True

    def recent_episodes(self, limit: int = 50) -> list[Episode]:
        """The newest episodes first, at most `limit`."""
        rows = self._read(
            f"SELECT e.id, {_EPISODE_E}, g.size FROM episodes e JOIN groups g ON g.id = e.group_id "
            "ORDER BY e.id DESC LIMIT ?",
            (limit,),
        )
        return [_episode_from_row(row) for row in rows]

    def recent_groups(self, limit: int = 50) -> list[Group]:
        rows = self._read(
            f"SELECT {_GROUP_FIELDS}, {_RECEIVED} FROM groups ORDER BY created_at DESC LIMIT ?", (limit,)
        )
        return [_group_from_row(row) for row in rows]

    def session_episode(self, session_id: str) -> Episode | None:
        rows = self._read(
            f"SELECT e.id, {_EPISODE_E}, g.size FROM episodes e JOIN groups g ON g.id = e.group_id "
            "WHERE e.session_id = ?",
            (session_id,),
        )
        return _episode_from_row(rows[0]) if rows else None


def _ensure_group(conn: sqlite3.Connection, ep: Episode) -> None:
    row = conn.execute("SELECT size FROM groups WHERE id = ?", (ep.group_id,)).fetchone()
    if row is None:
        conn.execute(
            "INSERT INTO groups (id, size, task, env, status, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (ep.group_id, ep.group_size, ep.task, ep.env, GROUP_OPEN, ep.created_at),
        )
    elif row[0] != ep.group_size:
        raise EpisodeConflict(f"group {ep.group_id!r} has size {row[0]}, not {ep.group_size}")


def _group(conn: sqlite3.Connection, group_id: str) -> Group:
    row = conn.execute(
        f"SELECT {_GROUP_FIELDS}, {_RECEIVED} FROM groups WHERE id = ?", (group_id,)
    ).fetchone()
    return _group_from_row(row)


def _group_from_row(row: sqlite3.Row) -> Group:
    return Group(**{name: row[name] for name in row.keys()})  # noqa: SIM118 (a Row is not a dict)


def _episode_from_row(row: sqlite3.Row) -> Episode:
    return Episode(
        session_id=row["session_id"],
        group_id=row["group_id"],
        group_size=row["size"],
        reward=row["reward"],
        reason=row["reason"],
        task=row["task"],
        env=row["env"],
        turns=row["turns"],
        tool_calls=row["tool_calls"],
        info=loads(row["info"]) or {},
        train=bool(row["train"]),
        created_at=row["created_at"],
        id=row["id"],
    )
