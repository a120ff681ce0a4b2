"""What the dashboard and /metrics read: small, bounded queries, whatever the run's size.

`StatsStore` is mixed into `Store`. Every query here reads either a table the
triggers of migration m005 keep up to date (`counters`, `reward_by_version`,
`reward_by_minute`: a few rows each), or a bounded number of rows through an
index (the latest sessions by `updated_at`, the latest versions by rowid), so a
refresh costs the same on a run of ten turns and on one of ten million
(`tests/unit/test_store_stats.py` checks the query plans).
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

_REWARD = "judged, scored, score_sum, positive, negative, hinted"

# The latest sessions, each with its turn count and the mean score of its judged turns
# (each turn's latest judgment). `INDEXED BY` pins each sub-query to one session's rows, so
# no statistics can ever talk the planner into scanning every turn.
RECENT_SESSIONS = """
SELECT s.id, s.user, s.source, s.created_at, s.updated_at, s.ended_at, s.end_reason,
    (SELECT count(*) FROM turns t INDEXED BY turns_session_idx WHERE t.session_id = s.id) AS turns,
    (SELECT count(*) FROM turns t INDEXED BY turns_session_idx
        WHERE t.session_id = s.id AND t.turn_type = 'main') AS main_turns,
    (SELECT avg(j.score) FROM turns t INDEXED BY turns_session_idx JOIN judgments j
        ON j.id = (SELECT max(id) FROM judgments WHERE turn_id = t.id)
        WHERE t.session_id = s.id) AS mean_score
FROM sessions s {where} ORDER BY s.updated_at DESC LIMIT ?
"""


class StatsStore:
    """Running totals and the latest rows, for the dashboard and /metrics (mixed into `Store`)."""

    if TYPE_CHECKING:  # provided by Store

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    def counters(self) -> dict[str, int]:
        """`sessions`, `turns:main`, `turns:side`, `turns:next_state`, `samples:<status>`."""
        return {row["name"]: row["n"] for row in self._read("SELECT name, n FROM counters")}

    def reward_by_version(self) -> dict[str, dict[str, int]]:
        """Judged turns by the version that served them: judged, scored, score_sum, positive, ..."""
        rows = self._read(f"SELECT version, {_REWARD} FROM reward_by_version")
        return {row["version"]: _reward(row) for row in rows}

    def reward_by_minute(self, since: float) -> list[dict[str, int]]:
        """Judged turns by the minute they were served, from `since` (unix seconds) on, oldest first."""
        rows = self._read(
            f"SELECT minute, {_REWARD} FROM reward_by_minute WHERE minute >= ? ORDER BY minute",
            (int(since // 60),),
        )
        return [{"minute": row["minute"], **_reward(row)} for row in rows]

    def recent_sessions(self, limit: int, user: str | None = None) -> list[dict[str, Any]]:
        """The `limit` sessions most recently active, newest first: `user`'s only, or everyone's (None)."""
        if user is None:
            return [dict(row) for row in self._read(RECENT_SESSIONS.format(where=""), (limit,))]
        rows = self._read(RECENT_SESSIONS.format(where="WHERE s.user = ?"), (user, limit))
        return [dict(row) for row in rows]

    def recent_versions(self, limit: int) -> list[dict[str, Any]]:
        """The `limit` latest published versions, newest first, every column (metrics parsed).

        `SELECT *`: a column added later (a version's status, say) reaches the dashboard as is.
        """
        rows = self._read("SELECT * FROM versions ORDER BY rowid DESC LIMIT ?", (limit,))
        return [{**dict(row), "metrics": json.loads(row["metrics"] or "{}")} for row in rows]

    def session_row(self, session_id: str) -> dict[str, Any] | None:
        """One session's row (id, source, times, end reason), or None."""
        rows = self._read("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return dict(rows[0]) if rows else None

    def per_user(self) -> dict[str, dict[str, Any]]:
        """Each figure by user, one grouped query a figure (`api/per_user.py` makes the rows): `turns`
        (user -> n), `samples` (user -> status -> n), `versions` (user -> gate status -> published
        versions, v0 not one), `memory` (owner -> experiences not retired). Each reads an index, not
        a table; the turns' one whole, so unlike the rest of this module it grows with the run."""
        turns = (
            "SELECT s.user AS k, count(*) AS n FROM sessions s JOIN turns t ON t.session_id = s.id"
            " GROUP BY s.user"
        )
        samples = "SELECT user AS k, status AS s, count(*) AS n FROM samples GROUP BY user, status"
        versions = (
            "SELECT user AS k, status AS s, count(*) AS n FROM versions WHERE name != 'v0' GROUP BY 1, 2"
        )
        memory = "SELECT owner AS k, count(*) AS n FROM experiences WHERE state != 'retired' GROUP BY owner"
        return {
            "turns": {r["k"]: r["n"] for r in self._read(turns)},
            "samples": _nested(self._read(samples)),
            "versions": _nested(self._read(versions)),
            "memory": {r["k"]: r["n"] for r in self._read(memory)},
        }

    def version_count(self) -> int:
        """How many versions exist, v0 included (a count, not the largest rowid: an erased user's
        versions are deleted, `clawrl users erase`; a few rows a version, a small table)."""
        return int(self._read("SELECT count(*) FROM versions")[0][0])


def _nested(rows: list[sqlite3.Row]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["k"], {})[r["s"]] = r["n"]
    return out


def _reward(row: sqlite3.Row) -> dict[str, int]:
    return {key: row[key] for key in _REWARD.split(", ")}
