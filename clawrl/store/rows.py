"""How the store's values become SQLite rows and back, and the longer SQL statements.

A `Turn` field is stored in the column of the same name (`index` in `idx`, a
reserved word); lists and dicts are JSON text (`ensure_ascii=False`, so text
stays readable in the file), floats are REAL. Python's `json` writes floats
with `repr`, so logprobs and timestamps read back bit-for-bit equal.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

from clawrl.types import Feedback, Turn

_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(Turn))
_COLUMN = {"index": "idx"}
_JSON_FIELDS = frozenset(
    {"messages", "tools", "prompt_ids", "response_ids", "logprobs", "tool_calls", "versions", "next_state"}
)
TURN_COLUMNS = ", ".join(_COLUMN.get(name, name) for name in _TURN_FIELDS)
INSERT_TURN = f"INSERT INTO turns ({TURN_COLUMNS}) VALUES ({', '.join('?' * len(_TURN_FIELDS))})"


def dumps(value: Any) -> str | None:
    """JSON text for a list or dict; None stays NULL."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def turn_row(turn: Turn) -> tuple[Any, ...]:
    """The values of `INSERT_TURN`, in `TURN_COLUMNS` order."""
    return tuple(
        dumps(getattr(turn, name)) if name in _JSON_FIELDS else getattr(turn, name) for name in _TURN_FIELDS
    )


def turn_from_row(row: sqlite3.Row) -> Turn:
    """A `Turn` from a row holding at least `TURN_COLUMNS` (extra columns are ignored)."""
    values = {name: row[_COLUMN.get(name, name)] for name in _TURN_FIELDS}
    return Turn(**{name: loads(v) if name in _JSON_FIELDS else v for name, v in values.items()})


def feedback_from_row(row: sqlite3.Row) -> Feedback:
    return Feedback(row["turn_id"], row["rating"], row["comment"], row["created_at"], row["id"])


# A known session is touched; one that ended only because the server stopped is reopened.
UPSERT_SESSION = """
INSERT INTO sessions (id, created_at, updated_at, source) VALUES (?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
    updated_at = max(updated_at, excluded.updated_at),
    ended_at = CASE WHEN end_reason = 'shutdown' THEN NULL ELSE ended_at END,
    end_reason = CASE WHEN end_reason = 'shutdown' THEN NULL ELSE end_reason END
"""

# Before a turn is inserted: a turn is never lost for want of its session row.
TOUCH_SESSION = """
INSERT INTO sessions (id, created_at, updated_at, source) VALUES (?1, ?2, ?3, 'unknown')
ON CONFLICT (id) DO UPDATE SET updated_at = max(updated_at, excluded.updated_at)
"""

OPEN_SESSIONS = """
SELECT s.id, s.source, s.updated_at,
    (SELECT count(*) FROM turns t WHERE t.session_id = s.id) AS turn_count,
    (SELECT t.id FROM turns t
        WHERE t.session_id = s.id AND t.turn_type = 'main' AND t.finish_reason != 'abort'
        ORDER BY t.idx DESC, t.rowid DESC LIMIT 1) AS last_id
FROM sessions s
WHERE (s.ended_at IS NULL OR s.end_reason = 'shutdown') AND s.updated_at >= ?
ORDER BY s.updated_at
"""
