"""Experiences: the memory half of the store (clawrl/memory, docs/memory.md).

`MemoryStore` is mixed into `Store`. The rules it keeps:

- `learn` writes one lesson of one turn in one transaction: the owner's experiences that share
  a word with it (the FTS5 index, best first) are compared by normalised-token similarity
  (`clawrl.memory.similar`); at `merge_at` or more the lesson merges into the most similar one
  (its provenance gains the turn and session, `seen` counts distinct turns, `last_seen` moves,
  `from_comment` is set once a rating comment taught it), else it is a new `active` experience
  (injected only once trusted: two sessions, or a comment, clawrl/memory/block.py). The text is
  capped (`clawrl.memory.lessons.cap`) here too, so nothing longer than the cap is ever stored
  (the judge loop drops such a lesson before it gets here). A lesson merging into a `retired`
  experience leaves it retired: what a user erased is not learnt back.
- `forget` retires an experience (never deletes it: the store only appends and updates) and
  marks its samples still `ready` `skipped` ("experience erased: ..."), in one transaction: the
  memory distillation samples whose teacher read it included.
- Only `active` experiences are ever offered to a request (`recall_candidates`).
- `insert_distillation` writes a turn's memory distillation sample (clawrl/algo/distill.py): at
  most one per turn, and none when one of its experiences is retired by then.
- `probed` records the retirement probe's measure and moves an experience between `active` and
  `distilled`; it never touches a `retired` one (clawrl/memory/retire.py).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from clawrl.memory.lessons import MAX_CHARS, cap
from clawrl.memory.similar import MERGE_AT, best_match, fts_query
from clawrl.store.rows import DISTILL_IDS, INSERT_SAMPLE, NOT_DISTILL, TURN_COLUMNS, sample_row, turn_from_row
from clawrl.types import DEFAULT_OWNER, EXPERIENCE_ACTIVE, EXPERIENCE_RETIRED, Experience, Sample, Turn

EXPERIENCE_COLUMNS = (
    "id, owner, text, state, turn_ids, session_ids, seen, created_at, last_seen, retired_at, gap, probed_at, "
    "from_comment"
)
MERGE_CANDIDATES = 20  # FTS hits compared with a new lesson
_E = ", ".join(f"e.{c.strip()}" for c in EXPERIENCE_COLUMNS.split(","))
_FTS_HITS = (
    f"SELECT {_E} FROM experiences_fts f JOIN experiences e ON e.id = f.rowid "
    "WHERE experiences_fts MATCH ? AND e.owner = ? {state} ORDER BY bm25(experiences_fts) LIMIT ?"
)
_INSERT = (
    "INSERT INTO experiences (owner, text, state, turn_ids, session_ids, seen, created_at, last_seen, "
    "from_comment) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?)"
)
_MERGE = (
    "UPDATE experiences SET turn_ids = ?, session_ids = ?, seen = ?, last_seen = ?, from_comment = ? "
    "WHERE id = ?"
)
_DROP_SAMPLES = (
    "UPDATE samples SET status = 'skipped', status_reason = ?1 WHERE status = 'ready' AND "
    "(CASE WHEN json_valid(payload) THEN json_extract(payload, '$.experience_id') END = ?2 "
    f"OR ?2 IN (SELECT value FROM json_each({DISTILL_IDS})))"
)
# The turn's memory distillation sample, unless superseded (?1: turn id).
_DISTILLED_TURN = f"SELECT 1 FROM samples WHERE turn_id = ?1 AND status != 'superseded' AND NOT {NOT_DISTILL}"
_RETIRED_AMONG = (
    f"SELECT id FROM experiences WHERE state = '{EXPERIENCE_RETIRED}' "
    "AND id IN (SELECT value FROM json_each(?))"
)
_PROBED = "UPDATE experiences SET state = ?, gap = ?, probed_at = ? WHERE id = ? AND state != ?"


def experience_from_row(row: sqlite3.Row) -> Experience:
    return Experience(
        id=row["id"],
        owner=row["owner"],
        text=row["text"],
        state=row["state"],
        turn_ids=json.loads(row["turn_ids"]),
        session_ids=json.loads(row["session_ids"]),
        seen=row["seen"],
        created_at=row["created_at"],
        last_seen=row["last_seen"],
        retired_at=row["retired_at"],
        gap=row["gap"],
        probed_at=row["probed_at"],
        from_comment=bool(row["from_comment"]),
    )


class MemoryStore:
    """The experiences of one run (mixed into `Store`)."""

    if TYPE_CHECKING:  # provided by Store

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    def learn(
        self,
        lesson: str,
        turn_id: str,
        session_id: str,
        now: float,
        owner: str | None = None,
        merge_at: float = MERGE_AT,
        max_chars: int = MAX_CHARS,
        from_comment: bool = False,
    ) -> Experience:
        """Merge `lesson` (taught by `turn_id`; by its rating comment: `from_comment`) into the owner's
        most similar experience, or add it. The owner is, unless named, the session's user (docs/users.md)."""
        text = cap(lesson, max_chars)
        with self._write() as conn:
            if owner is None:
                row = conn.execute("SELECT user FROM sessions WHERE id = ?", (session_id,)).fetchone()
                owner = row[0] if row is not None else DEFAULT_OWNER
            found = _fts(
                read=lambda sql, args: conn.execute(sql, args).fetchall(),
                text=text,
                owner=owner,
                state="",
                limit=MERGE_CANDIDATES,
            )
            key = best_match(text, ((e.id, e.text) for e in found), merge_at)
            if key is None:
                ids = (json.dumps([turn_id]), json.dumps([session_id]))
                cur = conn.execute(_INSERT, (owner, text, EXPERIENCE_ACTIVE, *ids, now, now, from_comment))
                return Experience(text, [turn_id], [session_id], owner, created_at=now, last_seen=now,
                                  from_comment=from_comment, id=int(cur.lastrowid or 0))  # fmt: skip
            e = next(e for e in found if e.id == key)
            if turn_id in e.turn_ids and (e.from_comment or not from_comment):
                return e  # the same turn judged again (a rating after the votes) teaches nothing new
            if turn_id in e.turn_ids:  # ... but its rating's comment vouches for it now
                conn.execute("UPDATE experiences SET from_comment = 1 WHERE id = ?", (e.id,))
                e.from_comment = True
                return e
            e.from_comment = e.from_comment or from_comment
            e.turn_ids.append(turn_id)
            if session_id not in e.session_ids:
                e.session_ids.append(session_id)
            e.seen, e.last_seen = e.seen + 1, max(e.last_seen, now)
            ids = (json.dumps(e.turn_ids), json.dumps(e.session_ids))
            conn.execute(_MERGE, (*ids, e.seen, e.last_seen, e.from_comment, e.id))
            return e

    def experiences(self, owner: str | None = DEFAULT_OWNER, state: str | None = None) -> list[Experience]:
        """The owner's experiences (every owner's: None; of one state, or all), last seen first."""
        where, args = _owned(owner, state)
        rows = self._read(
            f"SELECT {EXPERIENCE_COLUMNS} FROM experiences {where} ORDER BY last_seen DESC, id DESC", args
        )
        return [experience_from_row(row) for row in rows]

    def recent_experiences(self, limit: int, owner: str | None = DEFAULT_OWNER) -> list[Experience]:
        """The owner's (None: every owner's) `limit` experiences last seen most recently, every state
        (the dashboard's)."""
        where, args = _owned(owner, None)
        rows = self._read(
            f"SELECT {EXPERIENCE_COLUMNS} FROM experiences {where} ORDER BY last_seen DESC, id DESC LIMIT ?",
            (*args, limit),
        )
        return [experience_from_row(row) for row in rows]

    def experience(self, experience_id: int, owner: str = DEFAULT_OWNER) -> Experience | None:
        rows = self._read(
            f"SELECT {EXPERIENCE_COLUMNS} FROM experiences WHERE id = ? AND owner = ?", (experience_id, owner)
        )
        return experience_from_row(rows[0]) if rows else None

    def recall_candidates(self, text: str, owner: str = DEFAULT_OWNER, limit: int = 50) -> list[Experience]:
        """Active experiences a request may get: those sharing a word with `text` (best first), then the
        most often seen, at most `limit` of each."""
        hits = _fts(
            read=self._read, text=text, owner=owner, state=f"AND e.state = '{EXPERIENCE_ACTIVE}'", limit=limit
        )
        rows = self._read(
            f"SELECT {EXPERIENCE_COLUMNS} FROM experiences WHERE owner = ? AND state = ? "
            "ORDER BY seen DESC, last_seen DESC LIMIT ?",
            (owner, EXPERIENCE_ACTIVE, limit),
        )
        known = {e.id for e in hits}
        return hits + [e for e in map(experience_from_row, rows) if e.id not in known]

    def forget(self, experience_id: int, now: float, owner: str | None = DEFAULT_OWNER) -> Experience | None:
        """Retire an experience and skip its ready samples; None if the owner (None: any owner) has no
        such experience."""
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {EXPERIENCE_COLUMNS} FROM experiences WHERE id = ? AND owner = coalesce(?, owner)",
                (experience_id, owner),
            ).fetchone()
            if row is None:
                return None
            e = experience_from_row(row)
            if e.state != EXPERIENCE_RETIRED:
                e.state, e.retired_at = EXPERIENCE_RETIRED, now
                conn.execute(
                    "UPDATE experiences SET state = ?, retired_at = ? WHERE id = ?", (e.state, now, e.id)
                )
            conn.execute(_DROP_SAMPLES, (f"experience erased: {e.id} was retired by its user", e.id))
        return e

    def insert_distillation(self, sample: Sample) -> int | None:
        """Write a turn's memory distillation sample; its id, or None when the turn has one already
        (a turn judged again) or one of its experiences was retired since it was served."""
        ids = sample.experience_ids or []
        if not ids:
            raise ValueError("a memory distillation sample names the experiences it teaches")
        with self._write() as conn:
            if conn.execute(_DISTILLED_TURN, (sample.turn_id,)).fetchone() is not None:
                return None
            if conn.execute(_RETIRED_AMONG, (json.dumps(ids),)).fetchone() is not None:
                return None
            cur = conn.execute(INSERT_SAMPLE, sample_row(sample))
        sample.id = int(cur.lastrowid or 0)
        return sample.id

    def probed(self, experience_id: int, state: str, gap: float, now: float) -> Experience | None:
        """Record the retirement probe's `gap` and the `state` it decided (`active` or `distilled`);
        a retired experience is left as it is. The experience as it is now, or None if unknown."""
        if state == EXPERIENCE_RETIRED:
            raise ValueError("the probe moves experiences between active and distilled, never retires one")
        with self._write() as conn:
            conn.execute(_PROBED, (state, gap, now, experience_id, EXPERIENCE_RETIRED))
            row = conn.execute(
                f"SELECT {EXPERIENCE_COLUMNS} FROM experiences WHERE id = ?", (experience_id,)
            ).fetchone()
        return experience_from_row(row) if row is not None else None

    def probed_experiences(self, limit: int, owner: str = DEFAULT_OWNER) -> list[Experience]:
        """The owner's `active` and `distilled` experiences the retirement probe measures next: the
        least recently probed first (never probed before all), at most `limit`."""
        rows = self._read(
            f"SELECT {EXPERIENCE_COLUMNS} FROM experiences WHERE owner = ? AND state != ? "
            "ORDER BY coalesce(probed_at, 0), last_seen DESC LIMIT ?",
            (owner, EXPERIENCE_RETIRED, limit),
        )
        return [experience_from_row(row) for row in rows]

    def recent_main_turns(self, limit: int) -> list[Turn]:
        """The `limit` newest main turns that were answered (not aborted, with response tokens), newest
        first: the prompts the retirement probe measures on (every turn is the default owner's)."""
        rows = self._read(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE turn_type = 'main' AND finish_reason != 'abort' "
            "AND response_ids != '[]' ORDER BY created_at DESC, rowid DESC LIMIT ?",
            (limit,),
        )
        return [turn_from_row(row) for row in rows]


Rows = Callable[[str, tuple[Any, ...]], list[sqlite3.Row]]


def _owned(owner: str | None, state: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause and its arguments: the owner's (None: every owner's), of `state` (None: any)."""
    terms = [
        (term, value) for term, value in (("owner = ?", owner), ("state = ?", state)) if value is not None
    ]
    if not terms:
        return "", ()
    return "WHERE " + " AND ".join(t for t, _ in terms), tuple(v for _, v in terms)


def _fts(read: Rows, text: str, owner: str, state: str, limit: int) -> list[Experience]:
    """The owner's experiences sharing a word with `text`, best (bm25) first."""
    query = fts_query(text)
    if query is None:
        return []
    rows = read(_FTS_HITS.format(state=state), (query, owner, limit))
    return [experience_from_row(row) for row in rows]
