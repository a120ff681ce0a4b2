"""The dashboard's reads: running totals kept by m005's triggers, a backfill, and cheap query plans."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clawrl.store import migrations
from clawrl.store.db import Store
from clawrl.store.stats import RECENT_SESSIONS
from clawrl.testing import make_turn
from clawrl.types import Judgment, Vote
from tests.unit.test_store_training import sample

SMALL_TABLES = ("counters", "reward_by_version", "versions")  # a few rows per version or none


def fill(s: Store) -> None:
    """s1: main t0 (v2, minute 0) and t1 (v3, minute 1), side t2; s2: main u0 (v2). t0, t1 judged."""
    s.upsert_session("s1", "header", 1.0)
    s.insert_turn(make_turn("t0", "s1", 0, versions=["v2", "v3"], created_at=10.0))
    s.insert_turn(make_turn("t1", "s1", 1, versions=["v3"], created_at=70.0))
    s.insert_turn(make_turn("t2", "s1", 2, turn_type="side", created_at=71.0))
    s.upsert_session("s2", "body", 2.0)
    s.insert_turn(make_turn("u0", "s2", 0, versions=[], created_at=75.0))
    s.set_next_state("t0", [{"role": "user", "content": "redo"}], 80.0)
    s.set_next_state("t0", [{"role": "user", "content": "second call changes nothing"}], 81.0)
    s.insert_judgment(Judgment("t0", "j", [Vote("prm", -1)], -1, "say it shorter"), [sample("t0")])
    s.insert_judgment(Judgment("t1", "j", [Vote("prm", 1)], 1, None), [sample("t1"), sample("t1", "opd")])


def test_counters_follow_turns_next_states_and_sample_statuses(db):
    with Store.open(db) as s:
        fill(s)
        c = s.counters()
        assert (c["sessions"], c["turns:main"], c["turns:side"], c["turns:next_state"]) == (2, 3, 1, 1)
        assert c["samples:ready"] == 3 and c["samples:trained"] == 0
        ids = [x.id for x in s.ready_samples()]
        s.leave_out_samples({ids[0]: "too old"}, "stale")
        s.set_sample_status([ids[1]], "trained")
        s.set_sample_status([ids[1]], "trained")  # no change: counted once
        c = s.counters()
        assert (c["samples:ready"], c["samples:stale"], c["samples:trained"]) == (1, 1, 1)


def test_only_the_latest_judgment_of_a_turn_counts(db):
    with Store.open(db) as s:
        fill(s)
        by_version = s.reward_by_version()
        assert by_version["v2"] == dict(judged=1, scored=1, score_sum=-1, positive=0, negative=1, hinted=1)
        assert by_version["v3"]["score_sum"] == 1 and "v0" not in by_version
        s.insert_judgment(Judgment("t0", "feedback", [], 1, None))  # a rating overrides the PRM vote
        s.insert_judgment(Judgment("u0", "feedback", [], None, None))  # a turn with no versions: v0
        by_version = s.reward_by_version()
        assert by_version["v2"] == dict(judged=1, scored=1, score_sum=1, positive=1, negative=0, hinted=0)
        assert by_version["v0"] == dict(judged=1, scored=0, score_sum=0, positive=0, negative=0, hinted=0)
        minutes = {m["minute"]: m for m in s.reward_by_minute(since=0)}
        assert minutes[0]["score_sum"] == 1 and minutes[1]["judged"] == 2  # t1 and u0 at 70-75 s
        assert [m["minute"] for m in s.reward_by_minute(since=60)] == [1]


def test_recent_sessions_and_versions_are_newest_first(db):
    with Store.open(db) as s:
        fill(s)
        sessions = s.recent_sessions(10)
        assert [x["id"] for x in sessions] == ["s2", "s1"]  # s2 was active last (75 s)
        s1 = sessions[1]
        assert (s1["turns"], s1["main_turns"], s1["mean_score"]) == (3, 2, 0.0)
        assert [x["id"] for x in s.recent_sessions(1)] == ["s2"]
        assert s.version_count() == 1
        assert [v["name"] for v in s.recent_versions(5)] == ["v0"]


def test_m005_backfills_a_database_made_before_it(db, monkeypatch):
    with monkeypatch.context() as m:
        # Before m005, but with the columns today's Turn is written with (m007's rope_scaled, m008's
        # grammar, m010's sampling, m012's memory, m015's user, m016's next_state_match, m017's
        # version user, m019's reasoning).
        keep = [*migrations.MIGRATIONS[:4], *migrations.MIGRATIONS[6:8], *migrations.MIGRATIONS[9:12:2]]
        later = ("m015_users", "m016_next_state_match", "m017_version_user", "m019_turn_reasoning")
        keep += [m for m in migrations.MIGRATIONS if m[0] in later]
        m.setattr(migrations, "MIGRATIONS", keep)
        with Store.open(db) as s:
            fill(s)
            s.insert_judgment(Judgment("t0", "feedback", [], 1, None))
    with Store.open(db) as s:  # m005 runs now, over rows its triggers never saw
        assert s.counters()["turns:main"] == 3 and s.counters()["samples:ready"] == 2
        assert s.reward_by_version()["v2"]["score_sum"] == 1  # the latest judgment only
        s.insert_judgment(Judgment("t0", "feedback", [], -1, None))  # and the triggers go on from there
        assert s.reward_by_version()["v2"] == dict(
            judged=1, scored=1, score_sum=-1, positive=0, negative=1, hinted=0
        )


DASHBOARD_QUERIES = [
    ("SELECT name, n FROM counters", ()),
    ("SELECT * FROM reward_by_version", ()),
    ("SELECT * FROM reward_by_minute WHERE minute >= ? ORDER BY minute", (0,)),
    (RECENT_SESSIONS.format(where=""), (20,)),
    (RECENT_SESSIONS.format(where="WHERE s.user = ?"), ("alice", 20)),  # one user's (docs/users.md)
    ("SELECT * FROM versions ORDER BY rowid DESC LIMIT ?", (20,)),
    ("SELECT count(*) FROM versions", ()),
]


@pytest.mark.parametrize(("sql", "args"), DASHBOARD_QUERIES)
def test_no_dashboard_query_scans_a_big_table(db: Path, sql, args):
    with Store.open(db) as s:
        fill(s)
    conn = sqlite3.connect(db)
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
    # A bare SCAN reads every row; `SCAN s USING INDEX ...` under a LIMIT reads only what it returns.
    bare = [step for step in plan if step.startswith("SCAN") and "USING" not in step]
    scans = [step for step in bare if step.split()[1] not in SMALL_TABLES]
    assert scans == [], plan
    conn.close()


def test_the_writer_path_stays_on_indexes(db: Path):
    """The triggers run inside every judgment insert: their look-ups must use indexes too."""
    with Store.open(db) as s:
        fill(s)
    conn = sqlite3.connect(db)
    sql = "SELECT max(id) FROM judgments WHERE turn_id = ? AND id < ?"
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", ("t0", 9)))
    assert "USING COVERING INDEX judgments_turn" in plan
    conn.close()
