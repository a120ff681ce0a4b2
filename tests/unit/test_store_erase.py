"""Erasing a user in the store (clawrl/store/erase.py, m018): every row of alice's goes in one
transaction, bob's and the default user's stay as they were, the running totals equal a recount,
and alice's words are gone from the database file, the full-text index included."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from clawrl.store.db import Store
from clawrl.store.erase import KINDS, remove_checkpoints, user_folder
from clawrl.testing import make_turn
from clawrl.types import DEFAULT_USER, Episode, Feedback, Judgment, Sample, Version, Vote

SECRET = "quokkazanzibar"  # alice's word: in her prompt, answer, rating, hint and experience
USERS = ("alice", "bob", DEFAULT_USER)
MINUTE = 1_700_000_040.0  # every user's first turns fall in the same minutes: shared totals rows
TABLES = (
    "sessions",
    "turns",
    "feedback",
    "judgments",
    "samples",
    "episodes",
    "groups",
    "experiences",
    "versions",
)
# alice's rows, told by the names the fixture gives them (not by the module's own SQL).
ALICES_TURNS = "(SELECT id FROM turns WHERE session_id LIKE 'alice/%')"
ALICES = {
    "sessions": "id LIKE 'alice/%'",
    "turns": "session_id LIKE 'alice/%'",
    "feedback": f"turn_id IN {ALICES_TURNS}",
    "judgments": f"turn_id IN {ALICES_TURNS}",
    "samples": f"turn_id IN {ALICES_TURNS}",
    "episodes": "session_id LIKE 'alice/%'",
    "groups": "id = 'g-alice'",
    "experiences": "owner = 'alice'",
    "versions": "name LIKE 'alice/%'",
}
EVENT_COUNTERS = ("memory:distilled", "memory:reactivated")  # state changes: no row to recount


def sample(turn_id: str, kind: str = "rl", **kw) -> Sample:
    return Sample(turn_id, kind, [1, 2], [3], [-0.5], "v1", 1.0, reward=1.0, **kw)


def fill(store: Store) -> dict[str, list[int]]:
    """alice, bob and the default user, each with every kind of row; alice and bob share a group.

    Returns each user's experience ids."""
    experiences = {user: _user(store, user) for user in USERS}
    for user in ("alice", "bob"):  # one episode each in a group of two: a group shared by two users
        store.upsert_session(f"{user}/ep3", "header", MINUTE, user)
        store.insert_turn(make_turn(f"{user[0]}e3", f"{user}/ep3", 0, created_at=MINUTE + 3))
        store.record_episode(Episode(f"{user}/ep3", "g-shared", 2, None, "no reward", env="math"))
    store.close_group("g-shared", "dropped", "2 episode(s) without a reward", (None, None), [])
    return experiences


def _user(store: Store, user: str) -> list[int]:
    """One user's rows (see `fill`); their experience ids."""
    p, own = user[0], "v1" if user == DEFAULT_USER else f"{user}/v1"
    said = f"{SECRET} please" if user == "alice" else f"hello from {user}"
    store.upsert_session(f"{user}/main", "header", MINUTE, user)
    turns = [
        make_turn(f"{p}0", f"{user}/main", 0, created_at=MINUTE, versions=[own],
                  messages=[{"role": "user", "content": said}], response_text=said,
                  memory={"ids": [1], "block": "be brief"}),
        make_turn(f"{p}1", f"{user}/main", 1, created_at=MINUTE + 1, turn_type="side"),
        make_turn(f"{p}2", f"{user}/main", 2, created_at=MINUTE + 60, versions=["v1"],
                  memory={"ids": [], "dropped": "no room"}),
        make_turn(f"{p}3", f"{user}/main", 3, created_at=MINUTE + 61, versions=[]),
    ]  # fmt: skip
    for turn in turns:
        store.insert_turn(turn)
    store.set_next_state(f"{p}0", [{"role": "user", "content": f"again, {said}"}], MINUTE + 2)
    store.add_feedback(Feedback(f"{p}0", 1, f"good, {said}", MINUTE + 3))
    hint = Vote("hint", 1, f"[HINT_START]{said}[HINT_END]", said)
    store.insert_judgment(Judgment(f"{p}0", "j", [Vote("prm", -1), hint], -1, said), [sample(f"{p}0")])
    store.insert_judgment(Judgment(f"{p}0", "feedback", [], 1, None), [sample(f"{p}0", "opd")])
    store.insert_judgment(Judgment(f"{p}2", "j", [Vote("prm", 1)], 1, None), [sample(f"{p}2")])
    store.insert_judgment(Judgment(f"{p}3", "j", [Vote("prm", None)], None, None), [sample(f"{p}3")])
    e = store.learn(f"The user wants {said} in every answer.", f"{p}0", f"{user}/main", MINUTE + 4)
    store.insert_distillation(sample(f"{p}2", experience_ids=[e.id]))
    ready = {s.turn_id: s.id for s in store.ready_samples(user=user) if s.kind == "rl"}
    store.leave_out_samples({ready[f"{p}3"]: "too long: 9000 tokens"}, "skipped")
    _episodes(store, user)
    store.publish_version(Version(own, 1, f"checkpoints/{own}", {"samples": 1}, "v0"), [ready[f"{p}2"]])
    if user == "alice":
        store.publish_version(Version("alice/v2", 2, "checkpoints/alice/v2", {}, "alice/v1"), [])
    return [e.id]


def _episodes(store: Store, user: str) -> None:
    """Two episodes of `user`'s in the group g-<user>, closed `used` with one sample."""
    for n in (1, 2):
        session = f"{user}/ep{n}"
        store.upsert_session(session, "header", MINUTE, user)
        store.insert_turn(make_turn(f"{user[0]}e{n}", session, 0, created_at=MINUTE + 5))
        store.record_episode(Episode(session, f"g-{user}", 2, float(n), "done", env="math"))
    store.close_group(f"g-{user}", "used", None, (1.5, 0.5), [sample(f"{user[0]}e1")])


def rows(store: Store, table: str, where: str = "true") -> list[tuple]:
    return sorted(tuple(r) for r in store._read(f"SELECT * FROM {table} WHERE {where}"))


def others(store: Store) -> dict[str, list[tuple]]:
    """Every row that is not alice's, table by table."""
    return {t: rows(store, t, f"NOT ({ALICES[t]})") for t in TABLES}


def recount(store: Store) -> tuple[dict[str, int], dict[str, tuple], dict[int, tuple]]:
    """The counters (but the probe's events) and the reward tables, counted again from the rows."""
    skipped = "CASE WHEN instr(coalesce(status_reason, ''), ':') > 0 THEN substr(status_reason, 1, "
    skipped += "instr(status_reason, ':') - 1) ELSE 'other' END"
    memory = (
        "CASE WHEN json_extract(memory, '$.dropped') IS NULL THEN 'memory:injected' ELSE 'memory:dropped' END"
    )
    distill = "CASE WHEN json_valid(payload) THEN json_extract(payload, '$.experience_ids') END IS NOT NULL"
    counted = f"""
        SELECT 'sessions', count(*) FROM sessions
        UNION ALL SELECT 'turns:' || turn_type, count(*) FROM turns GROUP BY turn_type
        UNION ALL SELECT 'turns:next_state', count(*) FROM turns WHERE next_state IS NOT NULL
        UNION ALL SELECT {memory}, count(*) FROM turns WHERE memory IS NOT NULL GROUP BY 1
        UNION ALL SELECT 'samples:' || status, count(*) FROM samples GROUP BY status
        UNION ALL SELECT 'skipped:' || {skipped}, count(*) FROM samples WHERE status = 'skipped' GROUP BY 1
        UNION ALL SELECT 'memory:samples', count(*) FROM samples WHERE {distill}
        UNION ALL SELECT 'episodes', count(*) FROM episodes
        UNION ALL SELECT 'episodes:dropped', count(*) FROM episodes WHERE status = 'dropped'
        UNION ALL SELECT 'groups:' || status, count(*) FROM groups WHERE status != 'open' GROUP BY status"""
    counters = {name: n for name, n in store._read(counted) if n}
    latest = """SELECT {key} AS k, count(*), sum(j.score IS NOT NULL), sum(coalesce(j.score, 0)),
        sum(coalesce(j.score, 0) > 0), sum(coalesce(j.score, 0) < 0), sum(j.hint IS NOT NULL)
        FROM judgments j JOIN turns t ON t.id = j.turn_id
        WHERE j.id = (SELECT max(id) FROM judgments WHERE turn_id = j.turn_id) GROUP BY k"""
    by_version = store._read(latest.format(key="coalesce(json_extract(t.versions, '$[0]'), 'v0')"))
    by_minute = store._read(latest.format(key="CAST(t.created_at / 60 AS INTEGER)"))
    return counters, {r[0]: tuple(r[1:]) for r in by_version}, {r[0]: tuple(r[1:]) for r in by_minute}


def totals(store: Store) -> tuple[dict[str, int], dict[str, tuple], dict[int, tuple]]:
    """The running totals as the triggers keep them, in `recount`'s shape."""
    counters = {k: n for k, n in store.counters().items() if n and k not in EVENT_COUNTERS}
    by_version = {r[0]: tuple(r[1:]) for r in store._read("SELECT * FROM reward_by_version")}
    by_minute = {r[0]: tuple(r[1:]) for r in store._read("SELECT * FROM reward_by_minute")}
    return counters, by_version, by_minute


def test_erasing_alice_deletes_her_every_row_and_no_one_elses(db):
    with Store.open(db) as store:
        fill(store)
        assert all(rows(store, t, ALICES[t]) for t in TABLES)  # alice has rows of every kind
        kept, counted = others(store), store.user_rows("alice")
        erased = store.erase_user("alice")
        assert erased == counted == {
            "sessions": 4, "turns": 7, "feedback": 1, "judgments": 4, "samples": 6, "episodes": 3,
            "groups": 1, "experiences": 1, "versions": 2,
        }  # fmt: skip
        assert list(erased) == list(KINDS)
        assert others(store) == kept  # bob's and the default user's rows, every column, as they were
        assert all(rows(store, t) == kept[t] for t in TABLES)  # nothing of alice's is left
        assert rows(store, "groups", "id = 'g-shared'")  # bob's episode is still in it
        assert [v.name for v in store.versions(None)] == ["v0", "v1", "bob/v1"]
        assert store.user_rows("alice") == dict.fromkeys(KINDS, 0)


def test_after_an_erase_the_running_totals_equal_a_recount(db):
    with Store.open(db) as store:
        fill(store)
        assert totals(store) == recount(store)
        assert store.reward_by_version()["v1"]["judged"] == 4  # d0, and the p2 turns of all three
        store.erase_user("alice")
        assert totals(store) == recount(store)
        by_version = store.reward_by_version()
        assert "alice/v1" not in by_version and by_version["v1"]["judged"] == 3  # a2 is out of it
        assert store.counters()["sessions"] == 7 and store.version_count() == 3
        store.erase_user("bob")
        assert totals(store) == recount(store)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_deleting_a_turns_judgments_in_any_order_keeps_the_rewards_true(db, order):
    with Store.open(db) as store:
        store.upsert_session("s", "header", MINUTE)
        store.insert_turn(make_turn("t", "s", 0, created_at=MINUTE, versions=["v2"]))
        store.insert_turn(make_turn("u", "s", 1, created_at=MINUTE, versions=["v2"]))
        store.insert_judgment(Judgment("u", "j", [], 1, "a hint"))  # another turn of the same rows
        for score, hint in ((-1, "first"), (None, None), (1, "last")):
            store.insert_judgment(Judgment("t", "j", [], score, hint))
        ids = [r[0] for r in store._read("SELECT id FROM judgments WHERE turn_id = 't' ORDER BY id")]
        for i in order:
            with store._write() as conn:
                conn.execute("DELETE FROM judgments WHERE id = ?", (ids[i],))
            assert totals(store) == recount(store)
        assert store.reward_by_version()["v2"]["judged"] == 1  # u's alone


def _file_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists())


def test_alices_words_are_gone_from_the_file_and_the_full_text_index(db):
    with Store.open(db) as store:
        fill(store)
        assert store.recall_candidates(SECRET, owner="alice")
        store.erase_user("alice")
        assert store.recall_candidates(SECRET, owner="alice") == []
        match = "SELECT rowid FROM experiences_fts WHERE experiences_fts MATCH ?"
        assert store._read(match, (SECRET,)) == []
        assert store._read(match, ("bob",))  # bob's experience is still found
        assert SECRET.encode() not in _file_bytes(db)  # deleted pages zeroed, the log truncated
    assert SECRET.encode() not in _file_bytes(db)


def test_alices_words_were_in_the_file_before(db):  # so the test above proves something
    with Store.open(db) as store:
        fill(store)
        store._read("PRAGMA wal_checkpoint(TRUNCATE)")
        assert SECRET.encode() in _file_bytes(db)


def test_the_default_user_is_never_erased(db):
    with Store.open(db) as store:
        fill(store)
        with pytest.raises(ValueError, match="admin"):
            store.erase_user(DEFAULT_USER)
        assert rows(store, "sessions", "user = 'default'")


@pytest.mark.parametrize("name", ["default", "v3", "..", "", "Alice", "a/b", "a" * 33])
def test_no_folder_but_a_users_is_ever_removed(tmp_path, name):
    with pytest.raises(ValueError, match="is not a user's name"):
        user_folder(tmp_path, name)


def test_removing_alices_versions_leaves_the_others(tmp_path):
    for version in ("alice/v1", "alice/.v2-unpublished-1", "bob/v1", "v1"):
        (tmp_path / "checkpoints" / version).mkdir(parents=True)
        (tmp_path / "checkpoints" / version / "manifest.json").write_text("{}")
    assert remove_checkpoints(tmp_path, "alice") == tmp_path / "checkpoints" / "alice"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["bob", "v1"]
    assert remove_checkpoints(tmp_path, "alice") is None  # nothing left to remove


def test_m018_keeps_totals_on_a_database_migrated_from_before(db):
    """A database that had rows before m018 (its triggers never saw them) erases right too."""
    from clawrl.store import migrations

    before = [m for m in migrations.MIGRATIONS if m[0] != "m018_delete_triggers"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", before)
        with Store.open(db) as store:
            fill(store)
    conn = sqlite3.connect(db)
    assert "m018_delete_triggers" not in {n for (n,) in conn.execute("SELECT name FROM _migrations")}
    conn.close()
    with Store.open(db) as store:
        store.erase_user("alice")
        assert totals(store) == recount(store)
