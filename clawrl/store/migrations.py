"""Append-only, named schema migrations for the run's SQLite database.

`MIGRATIONS` is an ordered list of `(name, sql)`. The table
`_migrations(name, applied_at)` remembers which ones a database has had;
`migrate(conn)` applies the missing ones in order, each in its own
`BEGIN IMMEDIATE` transaction together with its ledger row, so a crash leaves a database either before or
after a migration, never half-way. Two processes opening the same new file at
once are safe: the second waits for the first's lock and then finds the
migration applied.

Never edit or reorder a migration that has shipped: a database in the field
has already run it. Change the schema by appending a new one, named
`mNNN_what_it_does`.

The SQL of each migration is a constant in `clawrl.store.schema`; this module names them, in
order, and applies them.
"""

from __future__ import annotations

import re
import sqlite3

from clawrl.store.schema import (
    M001_INITIAL,
    M002_SAMPLE_JUDGMENT_SESSION,
    M003_VERSION_PARENT,
    M004_SAMPLE_STATUS_REASON,
    M005_DASHBOARD_COUNTERS,
    M006_VERSION_CANARY,
    M007_TURN_ROPE,
    M008_TURN_GRAMMAR,
    M009_EPISODES,
    M010_TURN_SAMPLING,
    M011_SKIP_REASONS,
    M012_TURN_MEMORY,
    M013_EXPERIENCES,
    M014_MEMORY_DISTILL,
    M015_USERS,
    M016_NEXT_STATE_MATCH,
    M017_VERSION_USER,
    M018_DELETE_TRIGGERS,
    M019_TURN_REASONING,
    M020_SAMPLE_ATTEMPTS,
    M021_EXPERIENCE_FROM_COMMENT,
)

MIGRATIONS: list[tuple[str, str]] = [
    ("m001_initial", M001_INITIAL),
    ("m002_sample_judgment_session", M002_SAMPLE_JUDGMENT_SESSION),
    ("m003_version_parent", M003_VERSION_PARENT),
    ("m004_sample_status_reason", M004_SAMPLE_STATUS_REASON),
    ("m005_dashboard_counters", M005_DASHBOARD_COUNTERS),
    ("m006_version_canary", M006_VERSION_CANARY),
    ("m007_turn_rope", M007_TURN_ROPE),
    ("m008_turn_grammar", M008_TURN_GRAMMAR),
    ("m009_episodes", M009_EPISODES),
    ("m010_turn_sampling", M010_TURN_SAMPLING),
    ("m011_skip_reasons", M011_SKIP_REASONS),
    ("m012_turn_memory", M012_TURN_MEMORY),
    ("m013_experiences", M013_EXPERIENCES),
    ("m014_memory_distill", M014_MEMORY_DISTILL),
    ("m015_users", M015_USERS),
    ("m016_next_state_match", M016_NEXT_STATE_MATCH),
    ("m017_version_user", M017_VERSION_USER),
    ("m018_delete_triggers", M018_DELETE_TRIGGERS),
    ("m019_turn_reasoning", M019_TURN_REASONING),
    ("m020_sample_attempts", M020_SAMPLE_ATTEMPTS),
    ("m021_experience_from_comment", M021_EXPERIENCE_FROM_COMMENT),
]

_NAME = re.compile(r"m[0-9]{3}_[a-z0-9_]+")
_LEDGER_ROW = (
    "INSERT INTO _migrations (name, applied_at) VALUES ('{name}', (julianday('now') - 2440587.5) * 86400.0);"
)
_CREATE_LEDGER = "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL)"


def applied(conn: sqlite3.Connection) -> set[str]:
    """Names of the migrations this database has had (empty for a new file)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'"
    ).fetchone()
    if exists is None:
        return set()
    return {name for (name,) in conn.execute("SELECT name FROM _migrations")}


def pending(conn: sqlite3.Connection) -> list[str]:
    """Names of the known migrations not yet applied, in order."""
    done = applied(conn)
    return [name for name, _ in MIGRATIONS if name not in done]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the missing migrations in order; return the names applied now."""
    conn.execute(_CREATE_LEDGER)
    return [name for name, sql in MIGRATIONS if name not in applied(conn) and _apply(conn, name, sql)]


def _apply(conn: sqlite3.Connection, name: str, sql: str) -> bool:
    """Run one migration as a single script transaction; False if another process won the race.

    The whole transaction lives inside one `executescript` because Python 3.11's
    `executescript` commits any transaction already open. The ledger row goes in
    first, under the write lock: if another process applied the migration
    meanwhile, its primary key fails before any schema change runs.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad migration name {name!r}")
    script = f"BEGIN IMMEDIATE;\n{_LEDGER_ROW.format(name=name)}\n{sql}\nCOMMIT;"
    try:
        conn.executescript(script)
    except sqlite3.IntegrityError:
        _rollback(conn)
        if name in applied(conn):
            return False
        raise
    except BaseException:
        _rollback(conn)
        raise
    return True


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")
