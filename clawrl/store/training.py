"""Judgments and training samples: the judge's and the trainer's half of the store.

`TrainingStore` is mixed into `Store` and uses its lock-guarded `_write` and
`_read`. The rules it keeps:

- A turn may be judged many times (explicit feedback arriving later, a
  re-judge); rows are appended, and the latest judgment, the highest id, is
  the one that counts.
- Inserting a judgment marks the turn's samples still `ready` from earlier
  judgments (or from none) `superseded`, in the same transaction, so the
  trainer never takes a sample whose judgment has been replaced.
- A sample's status moves from `ready` to `trained`, `stale`, `skipped` or
  `superseded`; no row is ever deleted.
- A training step that raises counts a failed attempt for each sample it held
  (`fail_samples`, `attempts`: m020); a sample at its second is `skipped` with the
  exception as its reason (clawrl/train/failures.py).
- The trainer claims the samples of a step (`claim_samples`: `ready` ->
  `training`) before it trains them. A claimed sample is the trainer's: a newer
  judgment, a rating or a staleness mark landing during the step leaves it as
  it is, so the version that trains it marks it `trained`, exactly once
  (`Store.publish_version`). A step that is dropped, fails or dies hands its
  claims back (`release_samples`; a starting trainer releases every claim):
  each goes back to `ready`, or to `superseded` if its turn was judged again
  meanwhile.
- A turn is trained on at most once per sample kind: a later judgment of a turn
  with a `trained` sample of some kind writes no new sample of that kind, and
  the samples of a judgment that landed while the trainer held the turn's
  sample of that kind are `skipped` when that version is published (its reason
  names the version).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Collection, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from clawrl.store.errors import StoreError, UnknownTurn
from clawrl.store.rows import (
    AWAITING_JUDGMENT,
    INSERT_JUDGMENT,
    INSERT_SAMPLE,
    JUDGMENT_COLUMNS,
    NOT_DISTILL,
    SAMPLE_COLUMNS,
    SCORED_TURNS,
    judgment_from_row,
    judgment_row,
    sample_from_row,
    sample_row,
    turn_from_row,
)
from clawrl.types import Judgment, Sample, Turn

STATUSES = frozenset({"ready", "training", "trained", "stale", "skipped", "superseded"})
KINDS = frozenset({"rl", "opd"})

_USERS = "user IN (SELECT value FROM json_each(?))"  # the samples of a JSON list of users
_TRAINED_KINDS = (
    f"SELECT DISTINCT kind FROM samples WHERE turn_id = ? AND status = 'trained' AND {NOT_DISTILL}"
)
# Ready samples of the turn ?1 from a judgment older than ?2, or from none (memory distillation
# samples come from no judgment and no judgment replaces them).
_SUPERSEDE = (
    "UPDATE samples SET status = 'superseded' "
    f"WHERE turn_id = ?1 AND status = 'ready' AND (judgment_id IS NULL OR judgment_id < ?2) AND {NOT_DISTILL}"
)
# Released samples (the ids in the JSON array ?1) whose turn has a judgment newer than theirs.
_SUPERSEDE_RELEASED = (
    "UPDATE samples SET status = 'superseded' WHERE id IN (SELECT value FROM json_each(?1)) "
    f"AND status = 'ready' AND {NOT_DISTILL} AND coalesce(judgment_id, 0) < "
    "(SELECT coalesce(max(j.id), 0) FROM judgments j WHERE j.turn_id = samples.turn_id)"
)


class TrainingStore:
    """Judgments and samples of one run (mixed into `Store`)."""

    if TYPE_CHECKING:  # provided by Store

        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]: ...

    # -- judgments -----------------------------------------------------------------------------

    def insert_judgment(self, j: Judgment, samples: list[Sample] | None = None) -> int:
        """Record a judgment; returns its id (also set on `j`). UnknownTurn if the turn is unknown.

        The turn's earlier `ready` samples become `superseded`. `samples` made
        from this judgment (of its turn), if given, are written in the same
        transaction and get their `judgment_id` and `id`: a crash never leaves
        a judged turn without its samples, and a judged turn is not judged again.
        A sample of a kind the turn was already trained on is not written (its
        `id` stays None): a turn rated, trained on, then judged again when the
        conversation goes on is not trained on twice.
        """
        samples = samples or []
        _check_samples(samples)
        if any(sample.turn_id != j.turn_id for sample in samples):
            raise ValueError(f"samples given with a judgment of {j.turn_id!r} must be of that turn")
        with self._write() as conn:
            _require_turns(conn, [j.turn_id])
            jid = int(conn.execute(INSERT_JUDGMENT, judgment_row(j)).lastrowid or 0)
            conn.execute(_SUPERSEDE, (j.turn_id, jid))
            trained = {row[0] for row in conn.execute(_TRAINED_KINDS, (j.turn_id,))}
            fresh = [s for s in samples if s.kind not in trained]
            ids = _insert_samples(conn, [dataclasses.replace(s, judgment_id=jid) for s in fresh])
        j.id = jid
        for sample in fresh:
            sample.judgment_id = jid
        _set_ids(fresh, ids)
        return jid

    def latest_judgment(self, turn_id: str) -> Judgment | None:
        """The judgment that counts for a turn (the latest one), or None."""
        rows = self._read(
            f"SELECT {JUDGMENT_COLUMNS} FROM judgments WHERE turn_id = ? ORDER BY id DESC LIMIT 1",
            (turn_id,),
        )
        return judgment_from_row(rows[0]) if rows else None

    def judgment_for(self, turn_id: str) -> dict[str, Any] | None:
        """The latest judgment as plain JSON-ready values (votes as dicts), or None."""
        judgment = self.latest_judgment(turn_id)
        return None if judgment is None else dataclasses.asdict(judgment)

    def scored_turns(self, session_id: str) -> list[tuple[Turn, Judgment]]:
        """The session's judged turns by index, each with its latest judgment."""
        rows = self._read(SCORED_TURNS, (session_id,))
        return [(turn_from_row(row), judgment_from_row(row, prefix="j_")) for row in rows]

    def turns_awaiting_judgment(self) -> list[Turn]:
        """Main turns, not aborted, with a next state or feedback but no judgment yet; oldest first."""
        return [turn_from_row(row) for row in self._read(AWAITING_JUDGMENT)]

    # -- samples -------------------------------------------------------------------------------

    def insert_samples(self, samples: list[Sample]) -> list[int]:
        """Record samples in one transaction; returns their ids (also set on each).

        UnknownTurn if a sample's turn is unknown (then none is written);
        ValueError for an unknown kind or status.
        """
        _check_samples(samples)
        if not samples:
            return []
        with self._write() as conn:
            _require_turns(conn, [s.turn_id for s in samples])
            ids = _insert_samples(conn, samples)
        _set_ids(samples, ids)
        return ids

    def supersede_samples(self, turn_id: str, keep_judgment_id: int) -> int:
        """Mark the turn's `ready` samples from judgments older than `keep_judgment_id` (or from
        none) `superseded`; returns how many. `insert_judgment` already does this."""
        with self._write() as conn:
            return conn.execute(_SUPERSEDE, (turn_id, keep_judgment_id)).rowcount

    def ready_samples(
        self,
        limit: int | None = None,
        user: str | None = None,
        users: Collection[str] | None = None,
        untried: bool = False,
    ) -> list[Sample]:
        """Samples with status `ready`, oldest (first inserted) first, at most `limit`; only `user`'s
        (the user of the sample's session, docs/users.md) when one is named, only those of `users`
        when they are given; every user's when neither is. `untried`: only those no failed step
        held (`attempts` 0)."""
        where, args = _of_users(user, users)
        if untried:
            where += " AND attempts = 0"
        rows = self._read(
            f"SELECT {SAMPLE_COLUMNS} FROM samples WHERE status = 'ready' {where} ORDER BY id LIMIT ?",
            (*args, -1 if limit is None else limit),
        )
        return [sample_from_row(row) for row in rows]

    def set_sample_status(self, ids: list[int], status: str) -> None:
        """Set the status of samples; StoreError (and no change) if an id is unknown."""
        _check(status, STATUSES, "status")
        wanted = set(ids)
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE samples SET status = ? WHERE id IN (SELECT value FROM json_each(?))",
                (status, json.dumps(sorted(wanted))),
            )
            if cur.rowcount != len(wanted):
                raise StoreError(f"{len(wanted) - cur.rowcount} of {len(wanted)} sample ids are unknown")

    def claim_samples(self, ids: list[int]) -> list[int]:
        """Claim `ready` samples for the step about to train them (`ready` -> `training`), in one
        transaction; returns the ids claimed, in the order given. A sample no longer `ready`
        (superseded, left out or claimed since it was read) is not claimed."""
        with self._write() as conn:
            claimed = [
                i
                for i in dict.fromkeys(ids)
                if conn.execute(
                    "UPDATE samples SET status = 'training' WHERE id = ? AND status = 'ready'", (i,)
                ).rowcount
            ]
        return claimed

    def release_samples(self, ids: list[int] | None = None) -> int:
        """Hand claimed samples back (these, or every `training` one: a starting trainer's
        recovery); returns how many. Each goes back to `ready`, or to `superseded` if its turn was
        judged again while the trainer held it."""
        with self._write() as conn:
            if ids is None:
                ids = [row[0] for row in conn.execute("SELECT id FROM samples WHERE status = 'training'")]
            batch = json.dumps(sorted(set(ids)))
            released = conn.execute(
                "UPDATE samples SET status = 'ready' "
                "WHERE id IN (SELECT value FROM json_each(?)) AND status = 'training'",
                (batch,),
            ).rowcount
            conn.execute(_SUPERSEDE_RELEASED, (batch,))
        return released

    def fail_samples(self, ids: list[int], reason: str, limit: int) -> list[int]:
        """Count a failed training step for each claimed (`training`) sample of `ids`; those that
        reach `limit` failed steps are `skipped` with `reason`, in the same transaction. Returns
        the ids skipped; the others stay claimed, for the caller to release (`release_samples`)."""
        batch = json.dumps(sorted(set(ids)))
        with self._write() as conn:
            conn.execute(
                "UPDATE samples SET attempts = attempts + 1 "
                "WHERE id IN (SELECT value FROM json_each(?)) AND status = 'training'",
                (batch,),
            )
            skipped = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM samples WHERE id IN (SELECT value FROM json_each(?)) "
                    "AND status = 'training' AND attempts >= ? ORDER BY id",
                    (batch, limit),
                )
            ]
            conn.execute(
                "UPDATE samples SET status = 'skipped', status_reason = ? "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (reason, json.dumps(skipped)),
            )
        return skipped

    def turn_samples(self, turn_id: str) -> list[tuple[Sample, str | None]]:
        """Every sample of a turn, oldest first, each with its status reason (None: none)."""
        rows = self._read(
            f"SELECT {SAMPLE_COLUMNS}, status_reason FROM samples WHERE turn_id = ? ORDER BY id", (turn_id,)
        )
        return [(sample_from_row(row), row["status_reason"]) for row in rows]

    def leave_out_samples(self, reasons: dict[int, str], status: str) -> int:
        """Mark `ready` samples `stale` or `skipped`, each with its reason; returns how many changed.

        Samples no longer `ready` (trained, superseded meanwhile) are left as they are.
        """
        if status not in ("stale", "skipped"):
            raise ValueError(f"samples are left out as stale or skipped, not {status!r}")
        with self._write() as conn:
            return sum(
                conn.execute(
                    "UPDATE samples SET status = ?, status_reason = ? WHERE id = ? AND status = 'ready'",
                    (status, reason, sample_id),
                ).rowcount
                for sample_id, reason in reasons.items()
            )

    def sample_status(self, sample_id: int) -> tuple[str, str | None]:
        """(status, reason) of one sample; StoreError if it is unknown."""
        rows = self._read("SELECT status, status_reason FROM samples WHERE id = ?", (sample_id,))
        if not rows:
            raise StoreError(f"no sample {sample_id}")
        return rows[0][0], rows[0][1]

    def count_samples(
        self, status: str | None = None, kind: str | None = None, users: Collection[str] | None = None
    ) -> int:
        """How many samples there are, of one status and/or kind if given, of `users` if given."""
        filters = {"status": status, "kind": kind}
        clauses = [f"{name} = ?" for name, value in filters.items() if value is not None]
        args = tuple(value for value in filters.values() if value is not None)
        if users is not None:
            clauses.append(_USERS)
            args += (json.dumps(sorted(users)),)
        where = " AND ".join(clauses)
        rows = self._read(f"SELECT count(*) FROM samples{' WHERE ' + where if where else ''}", args)
        return int(rows[0][0])

    def ready_counts(self, users: Collection[str] | None = None) -> dict[str, int]:
        """Each user's `ready` samples (of `users` if given; users with none are left out): whose
        adapter the trainer can step next (`clawrl/train/rotation.py`), in one read of the index."""
        where, args = _of_users(None, users)
        rows = self._read(
            f"SELECT user, count(*) AS n FROM samples WHERE status = 'ready' {where} GROUP BY user", args
        )
        return {r["user"]: int(r["n"]) for r in rows}

    def session_rl_count(self, session_id: str) -> int:
        """How many samples carrying a reward the session's turns gave (`rl` ones, and `opd` ones
        with a reward: combine's), in any status but `superseded`."""
        rows = self._read(
            "SELECT count(*) FROM samples WHERE session_id = ? AND status != 'superseded' "
            "AND (kind = 'rl' OR (kind = 'opd' AND json_extract(payload, '$.reward') != 0))",
            (session_id,),
        )
        return int(rows[0][0])


def _of_users(user: str | None, users: Collection[str] | None) -> tuple[str, tuple[Any, ...]]:
    """The `AND ...` that keeps one user's samples, or those of a set of users ("" keeps all)."""
    if user is not None:
        return "AND user = ?", (user,)
    if users is not None:
        return f"AND {_USERS}", (json.dumps(sorted(users)),)
    return "", ()


def _check(value: str, allowed: frozenset[str], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown sample {what} {value!r} (one of {', '.join(sorted(allowed))})")


def _check_samples(samples: Iterable[Sample]) -> None:
    for sample in samples:
        _check(sample.kind, KINDS, "kind")
        _check(sample.status, STATUSES, "status")


def _require_turns(conn: sqlite3.Connection, turn_ids: list[str]) -> None:
    """UnknownTurn naming the first of `turn_ids` that the store does not hold."""
    wanted = set(turn_ids)
    found = {
        row[0]
        for row in conn.execute(
            "SELECT id FROM turns WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(sorted(wanted)),)
        )
    }
    missing = [turn_id for turn_id in turn_ids if turn_id not in found]
    if missing:
        raise UnknownTurn(f"no turn {missing[0]!r} in the store")


def _insert_samples(conn: sqlite3.Connection, samples: list[Sample]) -> list[int]:
    return [int(conn.execute(INSERT_SAMPLE, sample_row(sample)).lastrowid or 0) for sample in samples]


def _set_ids(samples: list[Sample], ids: list[int]) -> None:
    """Set ids only once the transaction committed, so a failed write leaves the objects as they were."""
    for sample, sample_id in zip(samples, ids, strict=True):
        sample.id = sample_id
