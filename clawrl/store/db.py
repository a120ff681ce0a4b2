"""The durable store: one SQLite file per run (`<run_dir>/clawrl.db`).

Errors (clawrl.store.errors, re-exported here):

    StoreError           base (a RuntimeError): no clawrl database there, schema too old, ...
    ├── StoreUnwritable  the file or its folder cannot be written (read-only, disk full)
    ├── StoreBusy        another connection held the database lock past the busy timeout
    ├── StoreOnNetwork   opened for writing on a network file system (NFS, SMB, ...): refused
    ├── UnknownTurn      feedback, a judgment or a sample for a turn that was never recorded
    ├── UnknownSession   an episode for a session that was never recorded
    └── EpisodeConflict  an episode posted twice, or a group posted with two sizes

Judgments and samples live in `clawrl.store.training` (`TrainingStore`, mixed in); the
dashboard's bounded reads in `clawrl.store.stats` (`StatsStore`); Track 2's episodes and
groups in `clawrl.store.episodes` (`EpisodeStore`); memory's experiences in `clawrl.store.memory`
(`MemoryStore`); a removed user's rows counted and erased in `clawrl.store.erase` (`EraseStore`).

The methods are synchronous. The server calls them from one dedicated writer
thread; the connection is shared (`check_same_thread=False`) and guarded by a
lock, so another thread may read safely too. Other processes (`clawrl records`,
later a judge) open their own connection: WAL mode lets them read while the
server writes. The API only inserts and updates (an erased experience is retired, not
deleted); the one delete is `clawrl users erase`, a removed user's every row (`EraseStore`).

`Store.open` fails loudly: after migrating it commits a real write, so a
read-only folder or a full disk is found at start, not on the first turn.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from clawrl.store import migrations
from clawrl.store.episodes import EpisodeStore
from clawrl.store.erase import EraseStore
from clawrl.store.errors import (
    EpisodeConflict,
    StoreBusy,
    StoreError,
    StoreOnNetwork,
    StoreUnwritable,
    UnknownSession,
    UnknownTurn,
)
from clawrl.store.filesystem import network_refusal
from clawrl.store.memory import MemoryStore
from clawrl.store.rows import (
    INSERT_TURN,
    OPEN_SESSIONS,
    TOUCH_SESSION,
    TURN_COLUMNS,
    UPSERT_SESSION,
    dumps,
    feedback_from_row,
    turn_from_row,
    turn_row,
)
from clawrl.store.stats import StatsStore
from clawrl.store.training import TrainingStore
from clawrl.store.versions import VersionStore
from clawrl.types import DEFAULT_USER, Feedback, Message, NextStateMatch, Turn

__all__ = [
    "EpisodeConflict",
    "OpenSession",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreOnNetwork",
    "StoreUnwritable",
    "UnknownSession",
    "UnknownTurn",
]

BUSY_TIMEOUT_S = 10.0
PAGE = 256  # turns read per query by `Store.turns`, so the lock is never held across a yield
_UNWRITABLE = ("SQLITE_READONLY", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM")
_BUSY = ("SQLITE_BUSY", "SQLITE_LOCKED")


@dataclass(frozen=True)
class OpenSession:
    """A session that had not ended (or ended only because the server stopped)."""

    id: str
    source: str  # header | body | inferred
    last_turn: Turn | None  # the latest main turn that was not aborted
    turn_count: int  # main and side turns alike
    updated_at: float
    user: str = DEFAULT_USER  # whose session: the name of the API key that opened it (server.users)


def _error(exc: sqlite3.Error, path: Path) -> StoreError:
    """Name the failure: unwritable storage is its own kind, the rest are StoreError."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith(_UNWRITABLE):
        return StoreUnwritable(f"cannot write the store {path}: {exc}")
    if name.startswith(_BUSY):
        return StoreBusy(f"store {path}: {exc} (another process holds its lock)")
    return StoreError(f"store {path}: {exc}")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # SQLite may have rolled back already (e.g. on SQLITE_FULL)
        conn.execute("ROLLBACK")


def _connect(
    target: Path | str, uri: bool = False, busy_timeout_s: float = BUSY_TIMEOUT_S
) -> sqlite3.Connection:
    conn = sqlite3.connect(target, uri=uri, timeout=busy_timeout_s, check_same_thread=False)
    conn.isolation_level = None  # autocommit: writes open their own BEGIN IMMEDIATE
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A `mode=ro` connection: it never creates or writes the file, and reads while a server writes.

    Reading a WAL database needs its `-shm` file. In a folder we cannot write,
    with no server running (so no `-shm` left behind), SQLite cannot create it;
    then, with no `-wal` content either, the file alone is the whole database
    and `immutable=1` reads it safely.
    """
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        conn = _connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise
        return _connect(uri + "&immutable=1", uri=True)


class Store(TrainingStore, VersionStore, StatsStore, EpisodeStore, MemoryStore, EraseStore):
    """Sessions, turns and feedback of one run; judgments and samples come from `TrainingStore`."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool = False) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        self.readonly = readonly

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Store:
        """Open the database at `path`, creating and migrating it unless `readonly`.

        Raises StoreUnwritable, naming the path, when a writable store cannot be
        written; StoreOnNetwork when it would be written on a network file system
        (clawrl/store/filesystem.py); StoreError when a read-only open finds no clawrl database.
        `busy_timeout_s`: how long a write waits for another connection's lock
        before it fails with StoreBusy.
        """
        path = Path(path)
        try:
            return cls._open_readonly(path) if readonly else cls._open_writable(path, busy_timeout_s)
        except sqlite3.Error as exc:
            if readonly:
                raise StoreError(f"cannot read the store {path}: {exc}") from exc
            raise _error(exc, path) from exc

    @classmethod
    def _open_writable(cls, path: Path, busy_timeout_s: float) -> Store:
        if refused := network_refusal(path):
            raise StoreOnNetwork(refused)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnwritable(f"cannot write the store {path}: {exc}") from exc
        store = cls(_connect(path, busy_timeout_s=busy_timeout_s), path)
        try:
            store._setup()
        except BaseException:
            store.close()
            raise
        return store

    def _setup(self) -> None:
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreUnwritable(f"cannot write the store {self.path}: WAL mode refused ({mode})")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        migrations.migrate(self._conn)
        with self._write() as conn:  # prove that a commit reaches the disk now, not on the first turn
            conn.execute("CREATE TABLE IF NOT EXISTS _write_probe (at REAL)")
            conn.execute("INSERT INTO _write_probe (at) VALUES (julianday('now'))")
            conn.execute("DELETE FROM _write_probe")

    @classmethod
    def _open_readonly(cls, path: Path) -> Store:
        if not path.is_file():
            raise StoreError(f"no clawrl database at {path}")
        conn = _connect_readonly(path)
        missing = migrations.pending(conn)
        if missing:
            conn.close()
            raise StoreError(
                f"{path} is not an up-to-date clawrl database (missing migrations: "
                f"{', '.join(missing)}); open it once with `clawrl serve` to upgrade it"
            )
        return cls(conn, path, readonly=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock: BEGIN IMMEDIATE, then COMMIT or ROLLBACK."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    _rollback(self._conn)
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(self._conn)
                raise _error(exc, self.path) from exc

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise _error(exc, self.path) from exc

    # -- sessions ------------------------------------------------------------------------------

    def upsert_session(self, id: str, source: str, now: float, user: str = DEFAULT_USER) -> None:
        """Insert a new session of `user`, or bump its updated_at; one ended by `shutdown` is reopened."""
        with self._write() as conn:
            conn.execute(UPSERT_SESSION, (id, now, now, source, user))

    def end_session(self, id: str, reason: str, now: float) -> bool:
        """Mark a session ended (done, idle, shutdown, ...); False if unknown or already ended."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                (now, reason, id),
            )
        return cur.rowcount == 1

    def session_exists(self, id: str) -> bool:
        return bool(self._read("SELECT 1 FROM sessions WHERE id = ?", (id,)))

    def session_user(self, id: str) -> str | None:
        """Whose session `id` is (None: no such session)."""
        rows = self._read("SELECT user FROM sessions WHERE id = ?", (id,))
        return rows[0]["user"] if rows else None

    def open_sessions(self, since: float) -> list[OpenSession]:
        """Sessions not ended (or ended by `shutdown`) and updated at or after `since`, oldest first."""
        return [
            OpenSession(
                id=row["id"],
                source=row["source"],
                last_turn=self.get_turn(row["last_id"]) if row["last_id"] else None,
                turn_count=row["turn_count"],
                updated_at=row["updated_at"],
                user=row["user"],
            )
            for row in self._read(OPEN_SESSIONS, (since,))
        ]

    # -- turns ---------------------------------------------------------------------------------

    def insert_turn(self, turn: Turn) -> None:
        """Record a turn; its session's updated_at moves to the turn's finish.

        A session the store does not know yet is created with source `unknown`
        rather than losing the turn (the caller should have upserted it first).
        """
        with self._write() as conn:
            conn.execute(TOUCH_SESSION, (turn.session_id, turn.created_at, turn.finished_at))
            conn.execute(INSERT_TURN, turn_row(turn))

    def set_next_state(
        self, turn_id: str, messages: list[Message], now: float, match: NextStateMatch | None = None
    ) -> bool:
        """Attach the messages that followed a turn, and how they were matched to it (`match`: see
        `NextStateMatch`); only the first call sets them (returns whether)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE turns SET next_state = ?, next_state_at = ?, next_state_match = ? "
                "WHERE id = ? AND next_state IS NULL",
                (dumps(messages), now, match, turn_id),
            )
        return cur.rowcount == 1

    def get_turn(self, turn_id: str) -> Turn | None:
        rows = self._read(f"SELECT {TURN_COLUMNS} FROM turns WHERE id = ?", (turn_id,))
        return turn_from_row(rows[0]) if rows else None

    def latest_main_turn(self, session_id: str) -> Turn | None:
        """The session's main turn with the highest index (an aborted one included)."""
        rows = self._read(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = ? AND turn_type = 'main' "
            "ORDER BY idx DESC, rowid DESC LIMIT 1",
            (session_id,),
        )
        return turn_from_row(rows[0]) if rows else None

    def recent_token_ids(self, limit: int, user: str | None = None) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, response ids) of the newest `limit` finished main turns with an answer (of
        `user`'s sessions, when named), newest first: the real prompts the canary measures KL on (side
        turns are left out)."""
        mine = "AND session_id IN (SELECT id FROM sessions WHERE user = ?) " if user is not None else ""
        rows = self._read(
            "SELECT prompt_ids, response_ids FROM turns WHERE turn_type = 'main' "
            f"AND finish_reason != 'abort' AND response_ids != '[]' {mine}ORDER BY created_at DESC LIMIT ?",
            (*([user] if user is not None else []), limit),
        )
        return [(json.loads(r["prompt_ids"]), json.loads(r["response_ids"])) for r in rows]

    def turns(self, session_id: str | None = None) -> Iterator[Turn]:
        """All turns by created_at, or one session's by index, read in pages of `PAGE`."""
        where, order = ("session_id = ? AND ", "idx") if session_id is not None else ("", "created_at")
        prefix = (session_id,) if session_id is not None else ()
        after: tuple[Any, ...] = (float("-inf"), -1)
        while True:
            rows = self._read(
                f"SELECT rowid AS _rowid, {TURN_COLUMNS} FROM turns WHERE {where}({order}, rowid) > (?, ?) "
                f"ORDER BY {order}, rowid LIMIT {PAGE}",
                (*prefix, *after),
            )
            yield from map(turn_from_row, rows)
            if len(rows) < PAGE:
                return
            after = (rows[-1][order], rows[-1]["_rowid"])

    # -- feedback ------------------------------------------------------------------------------

    def add_feedback(self, fb: Feedback) -> int:
        """Record a rating; returns its id (also set on `fb`). UnknownTurn if the turn is unknown."""
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM turns WHERE id = ?", (fb.turn_id,)).fetchone() is None:
                raise UnknownTurn(f"no turn {fb.turn_id!r} in the store")
            cur = conn.execute(
                "INSERT INTO feedback (turn_id, rating, comment, created_at) VALUES (?, ?, ?, ?)",
                (fb.turn_id, fb.rating, fb.comment, fb.created_at),
            )
        fb.id = int(cur.lastrowid or 0)
        return fb.id

    def feedback_for(self, turn_id: str) -> list[Feedback]:
        rows = self._read(
            "SELECT id, turn_id, rating, comment, created_at FROM feedback WHERE turn_id = ? ORDER BY id",
            (turn_id,),
        )
        return [feedback_from_row(row) for row in rows]

    def latest_feedback(self, turn_id: str) -> Feedback | None:
        """The turn's most recent rating (the highest id), or None."""
        rows = self._read(
            "SELECT id, turn_id, rating, comment, created_at FROM feedback WHERE turn_id = ? "
            "ORDER BY id DESC LIMIT 1",
            (turn_id,),
        )
        return feedback_from_row(rows[0]) if rows else None
