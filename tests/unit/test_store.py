"""The SQLite store: migrations, round trips, session restore, read-only readers, unwritable paths."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest

from clawrl.store import migrations
from clawrl.store.db import PAGE, Store, StoreError, StoreUnwritable, UnknownTurn
from clawrl.testing import make_turn
from clawrl.types import Feedback

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def store(db: Path):
    with Store.open(db) as s:
        yield s


def test_migrations_apply_once_and_reopening_is_idempotent(db):
    Store.open(db).close()
    Store.open(db).close()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT name, applied_at FROM _migrations").fetchall()
    names = [name for name, _ in rows]
    assert names == [name for name, _ in migrations.MIGRATIONS] == [name for name, _ in migrations.MIGRATIONS]
    assert conn.execute("SELECT name, step, path FROM versions").fetchall() == [("v0", 0, None)]
    conn.isolation_level = None
    assert migrations.migrate(conn) == []
    assert conn.execute("SELECT name, applied_at FROM _migrations").fetchall() == rows


def test_a_failing_migration_leaves_no_trace(tmp_path, monkeypatch):
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    migrations.migrate(conn)
    broken = "CREATE TABLE half (x INTEGER);\nINSERT INTO no_such_table VALUES (1);"
    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, ("m002_broken", broken)])
    with pytest.raises(sqlite3.OperationalError):
        migrations.migrate(conn)
    assert migrations.pending(conn) == ["m002_broken"]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None


def test_wal_mode_is_on(store, db):
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_turn_round_trip_keeps_every_field(store):
    turn = make_turn()
    store.upsert_session("s1", "header", turn.created_at)
    store.insert_turn(turn)
    assert store.get_turn(turn.id) == turn
    bare = make_turn("chatcmpl-2", index=1, tools=None, tool_calls=[], first_token_at=None, versions=[])
    store.insert_turn(bare)
    assert store.get_turn("chatcmpl-2") == bare
    assert store.get_turn("chatcmpl-none") is None


def test_next_state_is_set_only_once(store):
    store.upsert_session("s1", "body", 1.0)
    store.insert_turn(make_turn())
    first = [{"role": "tool", "tool_call_id": "call_0", "content": "12 °C"}]
    assert store.set_next_state("chatcmpl-1", first, 5.0) is True
    assert store.set_next_state("chatcmpl-1", [{"role": "user", "content": "later"}], 6.0) is False
    assert store.set_next_state("chatcmpl-unknown", first, 6.0) is False
    turn = store.get_turn("chatcmpl-1")
    assert (turn.next_state, turn.next_state_at) == (first, 5.0)


def test_feedback_is_appended_and_read_back(store):
    store.upsert_session("s1", "header", 1.0)
    store.insert_turn(make_turn())
    up, down = Feedback("chatcmpl-1", 1, "très bien", 10.0), Feedback("chatcmpl-1", -1, None, 11.0)
    first, second = store.add_feedback(up), store.add_feedback(down)
    assert second > first and (up.id, down.id) == (first, second)
    assert store.feedback_for("chatcmpl-1") == [up, down]
    with pytest.raises(UnknownTurn):
        store.add_feedback(Feedback("chatcmpl-unknown", 1))
    assert store.feedback_for("chatcmpl-unknown") == []


def test_latest_feedback_is_the_last_rating(store):
    store.upsert_session("s1", "header", 1.0)
    store.insert_turn(make_turn())
    assert store.latest_feedback("chatcmpl-1") is None
    store.add_feedback(Feedback("chatcmpl-1", -1, "non", 12.0))
    last = Feedback("chatcmpl-1", 1, "finalement oui ✓", 11.0)  # written last, though stamped earlier
    store.add_feedback(last)
    assert store.latest_feedback("chatcmpl-1") == last
    assert store.latest_feedback("chatcmpl-unknown") is None


def test_turns_are_ordered_and_paged(store):
    n = PAGE + 20  # more than one page
    for i in range(n):
        session = "even" if i % 2 == 0 else "odd"
        # created_at runs backwards for the odd session, so the two orders differ
        store.insert_turn(
            make_turn(f"t{i}", session, index=i // 2, created_at=float(i if i % 2 == 0 else -i))
        )
    everything = [t.created_at for t in store.turns()]
    assert len(everything) == n and everything == sorted(everything)
    odd = [t.index for t in store.turns("odd")]
    assert odd == list(range(n // 2))
    assert list(store.turns("nobody")) == []


def test_latest_main_turn_skips_side_turns(store):
    store.upsert_session("s1", "inferred", 1.0)
    store.insert_turn(make_turn("a", index=0))
    store.insert_turn(make_turn("b", index=1, finish_reason="abort"))
    store.insert_turn(make_turn("c", index=2, turn_type="side"))
    assert store.latest_main_turn("s1").id == "b"
    assert store.latest_main_turn("nobody") is None
    assert store.session_exists("s1") and not store.session_exists("nobody")


def test_a_turn_without_a_session_row_is_kept(store):
    store.insert_turn(make_turn(session_id="forgotten"))
    assert store.session_exists("forgotten")
    assert [s.source for s in store.open_sessions(0.0)] == ["unknown"]


def _populate_sessions(store: Store) -> None:
    store.upsert_session("active", "header", 100.0)
    store.insert_turn(make_turn("a0", "active", 0, created_at=100.0, finished_at=101.0))
    store.insert_turn(make_turn("a1", "active", 1, turn_type="side", created_at=102.0, finished_at=103.0))
    store.insert_turn(
        make_turn("a2", "active", 2, finish_reason="abort", created_at=104.0, finished_at=105.0)
    )
    store.upsert_session("done", "body", 100.0)
    store.insert_turn(make_turn("d0", "done", 0, created_at=100.0, finished_at=101.0))
    store.end_session("done", "done", 110.0)
    store.upsert_session("stopped", "inferred", 100.0)
    store.end_session("stopped", "shutdown", 120.0)
    store.upsert_session("stale", "header", 10.0)


def test_open_sessions_survive_a_restart(db):
    with Store.open(db) as store:
        _populate_sessions(store)
    with Store.open(db) as store:  # the server restarted
        sessions = {s.id: s for s in store.open_sessions(since=50.0)}
        assert set(sessions) == {"active", "stopped"}
        active = sessions["active"]
        assert (active.source, active.turn_count, active.updated_at) == ("header", 3, 105.0)
        assert active.last_turn == make_turn("a0", "active", 0, created_at=100.0, finished_at=101.0)
        assert sessions["stopped"].last_turn is None and sessions["stopped"].turn_count == 0
        assert [s.id for s in store.open_sessions(since=0.0)] == ["stale", "stopped", "active"]


def test_ending_and_reopening_sessions(store):
    _populate_sessions(store)
    assert store.end_session("done", "idle", 130.0) is False  # the first end stays
    assert store.end_session("nobody", "idle", 130.0) is False
    store.upsert_session("done", "body", 140.0)  # ended for real: not reopened
    store.upsert_session("stopped", "inferred", 140.0)  # ended by the shutdown: reopened
    assert {s.id for s in store.open_sessions(since=130.0)} == {"stopped"}
    assert store.end_session("stopped", "idle", 150.0) is True


def test_parent_is_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StoreUnwritable, match=str(tmp_path / "file")):
        Store.open(tmp_path / "file" / "clawrl.db")


def test_database_path_is_a_folder(tmp_path):
    (tmp_path / "clawrl.db").mkdir()
    with pytest.raises(StoreUnwritable, match="clawrl.db"):
        Store.open(tmp_path / "clawrl.db")


@pytest.mark.skipif(IS_ROOT, reason="root ignores permission bits; see the test run as nobody below")
def test_read_only_folder_fails_at_open(tmp_path):
    folder = tmp_path / "run"
    Store.open(folder / "clawrl.db").close()
    folder.chmod(0o555)
    try:
        with pytest.raises(StoreUnwritable, match="clawrl.db"):
            Store.open(folder / "clawrl.db")
        with pytest.raises(StoreUnwritable):
            Store.open(folder / "new.db")
        with Store.open(folder / "clawrl.db", readonly=True) as reader:
            assert list(reader.turns()) == []
    finally:
        folder.chmod(0o755)


def _probe(paths: list[Path]) -> str:
    """What an unprivileged user gets from opening each path, one line each, then a read-only reader."""
    lines = []
    for path in paths:
        try:
            Store.open(path).close()
            lines.append(f"{path.name} opened")
        except StoreUnwritable as exc:
            lines.append(f"{path.name} StoreUnwritable {exc}")
    with Store.open(paths[0], readonly=True) as reader:
        lines.append(f"reader {len(list(reader.turns()))}")
    return "\n".join(lines)


def _as_nobody(fn, *args) -> str:
    """Run `fn` in a forked child that dropped root for nobody (no exec: the modules are loaded)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = fn(*args)
        except BaseException as exc:  # reported to the parent through the pipe
            out = f"crashed: {exc!r}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def shared_folder():
    """A folder outside tmp_path (whose parents are private to root), so nobody can reach it."""
    folder = Path(tempfile.mkdtemp(prefix="clawrl-ro-"))
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to drop to the unprivileged user nobody")
def test_read_only_folder_fails_at_open_as_nobody(shared_folder):
    with Store.open(shared_folder / "clawrl.db") as store:
        store.insert_turn(make_turn())
    shared_folder.chmod(0o755)  # nobody may read it, not write it
    (shared_folder / "clawrl.db").chmod(0o666)  # even a writable file in a read-only folder must fail
    lines = _as_nobody(_probe, [shared_folder / "clawrl.db", shared_folder / "new.db"]).splitlines()
    assert lines[0].startswith("clawrl.db StoreUnwritable cannot write the store"), lines
    assert str(shared_folder / "clawrl.db") in lines[0]
    assert lines[1].startswith("new.db StoreUnwritable"), lines
    assert lines[2] == "reader 1", lines  # a read-only reader still works there


@pytest.mark.skipif(not IS_ROOT, reason="needs root to drop to the unprivileged user nobody")
def test_read_only_file_fails_at_open_as_nobody(shared_folder):
    # The folder is writable, so SQLite opens the file read-only without a word and the
    # WAL files can be created: only the write made at open finds the problem.
    Store.open(shared_folder / "clawrl.db").close()
    shared_folder.chmod(0o777)
    (shared_folder / "clawrl.db").chmod(0o444)
    lines = _as_nobody(_probe, [shared_folder / "clawrl.db"]).splitlines()
    assert lines[0].startswith("clawrl.db StoreUnwritable cannot write the store"), lines
    assert lines[1] == "reader 0", lines


def test_reader_sees_the_writers_rows_while_it_is_open(db):
    with Store.open(db) as writer:
        writer.upsert_session("s1", "header", 1.0)
        writer.insert_turn(make_turn("t0"))
        with Store.open(db, readonly=True) as reader:
            assert reader.get_turn("t0") == make_turn("t0")
            writer.insert_turn(make_turn("t1", index=1))
            writer.set_next_state("t0", [{"role": "user", "content": "et après ?"}], 9.0)
            assert [t.id for t in reader.turns("s1")] == ["t0", "t1"]
            assert reader.get_turn("t0").next_state == [{"role": "user", "content": "et après ?"}]
            with pytest.raises(StoreUnwritable):
                reader.upsert_session("s2", "header", 2.0)


def test_readonly_open_of_what_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="no clawrl database"):
        Store.open(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "text.db").write_text("hello " * 1000)
    with pytest.raises(StoreError):
        Store.open(tmp_path / "text.db", readonly=True)
    sqlite3.connect(tmp_path / "empty.db").execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(StoreError, match="missing migrations: m001_initial"):
        Store.open(tmp_path / "empty.db", readonly=True)


def test_a_reader_thread_and_the_writer_thread_share_one_store(store):
    store.upsert_session("s1", "header", 1.0)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(200):
                store.insert_turn(make_turn(f"t{i}", index=i))
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        seen = [t.index for t in store.turns("s1")]
        assert seen == list(range(len(seen)))
    writer.join()
    assert errors == [] and len(list(store.turns("s1"))) == 200


def test_latest_version_orders_by_number_not_text(store):
    from clawrl.types import Version

    assert store.latest_version().name == "v0"
    for n in range(1, 12):
        store.publish_version(Version(f"v{n}", n, f"/ckpt/v{n}"), trained=[])
    assert store.latest_version().name == "v11"
    assert [v.name for v in store.versions()][-3:] == ["v9", "v10", "v11"]
