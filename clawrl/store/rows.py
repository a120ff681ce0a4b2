"""How the store's values become SQLite rows and back, and the longer SQL statements.

A `Turn` field is stored in the column of the same name (`index` in `idx`, a
reserved word); lists and dicts are JSON text (`ensure_ascii=False`, so text
stays readable in the file), floats are REAL. Python's `json` writes floats
with `repr`, so logprobs and timestamps read back bit-for-bit equal.

A `Judgment`'s votes are one JSON list of objects with the `Vote` fields. A
`Sample` keeps the fields it is selected or counted by in columns (turn_id,
kind, status, created_at, version, judgment_id) and every other field in the
JSON object `payload`, so a field added to `Sample` later needs no migration.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

from clawrl.types import Feedback, Judgment, Sample, Turn, Vote

_TURN_FIELDS = tuple(f.name for f in dataclasses.fields(Turn))
_COLUMN = {"index": "idx"}
_JSON_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "prompt_ids",
        "response_ids",
        "logprobs",
        "tool_calls",
        "versions",
        "next_state",
        "grammar",
        "sampling",
        "memory",
        "chat_template_kwargs",
    }
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
    if values["rope_scaled"] is not None:  # SQLite keeps a bool as 0 / 1
        values["rope_scaled"] = bool(values["rope_scaled"])
    return Turn(**{name: loads(v) if name in _JSON_FIELDS else v for name, v in values.items()})


def feedback_from_row(row: sqlite3.Row) -> Feedback:
    return Feedback(
        turn_id=row["turn_id"],
        rating=row["rating"],
        comment=row["comment"],
        created_at=row["created_at"],
        id=row["id"],
    )


JUDGMENT_COLUMNS = "id, turn_id, created_at, score, hint, votes, judge"
INSERT_JUDGMENT = (
    "INSERT INTO judgments (turn_id, created_at, score, hint, votes, judge) VALUES (?, ?, ?, ?, ?, ?)"
)


def judgment_row(j: Judgment) -> tuple[Any, ...]:
    """The values of `INSERT_JUDGMENT`."""
    votes = [dataclasses.asdict(vote) for vote in j.votes]
    return (j.turn_id, j.created_at, j.score, j.hint, dumps(votes), j.judge)


def judgment_from_row(row: sqlite3.Row, prefix: str = "") -> Judgment:
    """A `Judgment` from `JUDGMENT_COLUMNS`, each named `prefix + column` (a join aliases them)."""
    return Judgment(
        turn_id=row[prefix + "turn_id"],
        judge=row[prefix + "judge"],
        votes=[Vote(**vote) for vote in loads(row[prefix + "votes"])],
        score=row[prefix + "score"],
        hint=row[prefix + "hint"],
        created_at=row[prefix + "created_at"],
        id=row[prefix + "id"],
    )


_SAMPLE_COLUMNS = ("turn_id", "kind", "status", "created_at", "version", "judgment_id")
_SAMPLE_OWN = ("id", "attempts")  # columns of their own that the store sets, never inserted
_SAMPLE_PAYLOAD = tuple(
    f.name for f in dataclasses.fields(Sample) if f.name not in _SAMPLE_COLUMNS and f.name not in _SAMPLE_OWN
)
SAMPLE_COLUMNS = f"id, {', '.join(_SAMPLE_COLUMNS)}, payload, attempts"
# A sample's memory distillation experiences (clawrl/algo/distill.py) as JSON, NULL for other samples.
# A payload with a non-finite logprob is not valid JSON to SQLite (json.dumps writes NaN), so it is
# read only where valid: json_extract would fail the whole statement.
DISTILL_IDS = "(CASE WHEN json_valid(payload) THEN json_extract(payload, '$.experience_ids') END)"
# True for a sample that is not a memory distillation sample: the rules that keep a turn trained once
# per kind, and a newer judgment superseding older samples, leave those alone.
NOT_DISTILL = f"({DISTILL_IDS} IS NULL)"
# 1 for a hint rewrite (clawrl/algo/rewrite.py), 0 otherwise: a rewrite and its turn's own sample of the
# same kind are each trained once (NULL for a payload that is not valid JSON, as above).
REWRITE = "(CASE WHEN json_valid(payload) THEN coalesce(json_extract(payload, '$.rewrite'), 0) END)"
# session_id and user are copied from the turn (?1 is turn_id) and its session, so per-session
# counts and one user's samples need no join.
INSERT_SAMPLE = (
    f"INSERT INTO samples ({', '.join(_SAMPLE_COLUMNS)}, payload, session_id, user) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, (SELECT session_id FROM turns WHERE id = ?1), coalesce("
    "(SELECT s.user FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = ?1), 'default'))"
)


def sample_row(sample: Sample) -> tuple[Any, ...]:
    """The values of `INSERT_SAMPLE`: the column fields, then the payload."""
    payload = {name: getattr(sample, name) for name in _SAMPLE_PAYLOAD}
    return (*(getattr(sample, name) for name in _SAMPLE_COLUMNS), dumps(payload))


def sample_from_row(row: sqlite3.Row) -> Sample:
    """A `Sample` from `SAMPLE_COLUMNS`."""
    values = {name: row[name] for name in _SAMPLE_COLUMNS}
    return Sample(**values, **loads(row["payload"]), id=row["id"], attempts=row["attempts"])


# A known session is touched; one that ended only because the server stopped is reopened.
UPSERT_SESSION = """
INSERT INTO sessions (id, created_at, updated_at, source, user) VALUES (?, ?, ?, ?, ?)
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
SELECT s.id, s.source, s.updated_at, s.user,
    (SELECT count(*) FROM turns t WHERE t.session_id = s.id) AS turn_count,
    (SELECT t.id FROM turns t
        WHERE t.session_id = s.id AND t.turn_type = 'main' AND t.finish_reason != 'abort'
        ORDER BY t.idx DESC, t.rowid DESC LIMIT 1) AS last_id
FROM sessions s
WHERE (s.ended_at IS NULL OR s.end_reason = 'shutdown') AND s.updated_at >= ?
ORDER BY s.updated_at
"""

_TURN_COLUMNS_T = ", ".join(f"t.{column}" for column in TURN_COLUMNS.split(", "))
_LATEST_JUDGMENT_J = ", ".join(f"j.{column} AS j_{column}" for column in JUDGMENT_COLUMNS.split(", "))

# The session's judged turns, each joined to its latest judgment (the highest id).
SCORED_TURNS = f"""
SELECT {_TURN_COLUMNS_T}, {_LATEST_JUDGMENT_J}
FROM turns t JOIN judgments j ON j.id = (SELECT max(id) FROM judgments WHERE turn_id = t.id)
WHERE t.session_id = ?
ORDER BY t.idx, t.rowid
"""

# What the judge had queued when the server stopped: main turns with something to judge on.
AWAITING_JUDGMENT = f"""
SELECT {_TURN_COLUMNS_T} FROM turns t
WHERE t.turn_type = 'main' AND t.finish_reason != 'abort'
    AND (t.next_state IS NOT NULL OR EXISTS (SELECT 1 FROM feedback f WHERE f.turn_id = t.id))
    AND NOT EXISTS (SELECT 1 FROM judgments j WHERE j.turn_id = t.id)
ORDER BY t.created_at, t.rowid
"""
