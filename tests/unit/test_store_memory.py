"""Experiences in the store: learning and merging through the FTS index, provenance, the cap,
retiring (its samples dropped), owners, m012 on an older database, and the memory counters."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clawrl.memory import MAX_CHARS
from clawrl.store import migrations
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.types import EXPERIENCE_ACTIVE, EXPERIENCE_RETIRED, Sample


@pytest.fixture
def store(db: Path):
    with Store.open(db) as s:
        for sid, tids in (("s1", ("t0", "t1")), ("s2", ("u0", "u1"))):
            s.upsert_session(sid, "header", 1.0)
            for i, tid in enumerate(tids):
                s.insert_turn(make_turn(tid, sid, i))
        yield s


def test_a_new_lesson_is_an_active_experience_with_its_provenance(store):
    e = store.learn("Answer in French.", "t0", "s1", now=10.0)
    assert e.id and e.state == EXPERIENCE_ACTIVE and e.seen == 1
    (back,) = store.experiences()
    assert back == e and back.turn_ids == ["t0"] and back.session_ids == ["s1"]
    assert back.created_at == back.last_seen == 10.0


def test_similar_lessons_merge_counting_distinct_turns(store):
    first = store.learn("Answer in French.", "t0", "s1", now=10.0)
    again = store.learn("Always answer in French!", "u0", "s2", now=20.0)
    same_turn = store.learn("answer in french", "u0", "s2", now=30.0)  # the turn judged again
    other = store.learn("Use metric units.", "u1", "s2", now=40.0)
    assert again.id == same_turn.id == first.id != other.id
    merged = store.experience(first.id)
    assert merged.text == "Answer in French."  # the first wording stays
    assert merged.turn_ids == ["t0", "u0"] and merged.session_ids == ["s1", "s2"]
    assert merged.seen == 2 and merged.last_seen == 20.0
    assert [e.id for e in store.experiences()] == [other.id, first.id]  # last seen first


def test_an_experience_past_its_cap_is_cut_never_stored_whole(store, db):
    long = "Reply in " + "very " * 80 + "plain English."
    e = store.learn(long, "t0", "s1", now=1.0)
    (text,) = sqlite3.connect(db).execute("SELECT text FROM experiences").fetchone()
    assert text == e.text and len(text) <= MAX_CHARS and "plain English" not in text


def test_forget_retires_and_drops_its_ready_samples_but_deletes_nothing(store):
    e = store.learn("Answer in French.", "t0", "s1", now=1.0)
    teach = Sample("t1", "opd", [1, 2], [3], [-0.5], "v0", 1.0, hint="h", experience_id=e.id)
    other = Sample("t1", "rl", [1, 2], [3], [-0.5], "v0", 1.0, reward=1.0)
    store.insert_samples([teach, other])
    gone = store.forget(e.id, now=5.0)
    assert gone.state == EXPERIENCE_RETIRED and gone.retired_at == 5.0
    assert store.experience(e.id).state == EXPERIENCE_RETIRED  # kept, retired
    status, reason = store.sample_status(teach.id)
    assert status == "skipped" and reason.startswith("experience erased")
    assert store.sample_status(other.id) == ("ready", None)
    assert store.forget(e.id, now=9.0).retired_at == 5.0  # forgetting twice changes nothing
    assert store.forget(9999, now=1.0) is None


def test_a_lesson_like_a_retired_one_stays_retired_and_is_never_recalled(store):
    e = store.learn("Answer in French.", "t0", "s1", now=1.0)
    store.forget(e.id, now=2.0)
    back = store.learn("Please always answer in French.", "u0", "s2", now=3.0)
    assert back.id == e.id and store.experience(e.id).state == EXPERIENCE_RETIRED
    assert store.recall_candidates("answer in french") == []


def test_recall_candidates_are_the_owners_active_ones_matching_first(store):
    short = store.learn("Keep answers short and to the point.", "t0", "s1", now=1.0)
    store.learn("Keep answers short.", "t1", "s1", now=2.0)  # merges: seen twice
    metric = store.learn("Use metric units.", "u0", "s2", now=3.0)
    theirs = store.learn("Answer in German.", "u1", "s2", now=4.0, owner="someone-else")
    got = store.recall_candidates("which units for the weather?")
    assert [e.id for e in got] == [metric.id, short.id]
    assert store.experience(theirs.id) is None and store.forget(theirs.id, now=5.0) is None
    assert [e.id for e in store.experiences("someone-else")] == [theirs.id]
    assert [e.id for e in store.experiences(state=EXPERIENCE_ACTIVE)] == [metric.id, short.id]
    assert [e.id for e in store.recent_experiences(1)] == [metric.id]  # the dashboard's, bounded


def test_any_request_text_is_a_safe_fts_query(store):
    store.learn("Use metric units.", "t0", "s1", now=1.0)
    for text in ('NEAR( "x" OR * ^ -', "", "123 ?!", "units" * 5000, 'unit\'s "units" UNITS'):
        assert isinstance(store.recall_candidates(text), list)
    assert [e.text for e in store.recall_candidates('"units" AND (metric)')] == ["Use metric units."]


def test_turns_record_their_memory_and_the_counters_count_it(store):
    store.insert_turn(make_turn("t2", "s1", 2, memory={"ids": [1], "block": "B"}))
    store.insert_turn(make_turn("t3", "s1", 3, memory={"ids": [], "dropped": "window"}))
    assert store.get_turn("t2").memory == {"ids": [1], "block": "B"}
    assert store.get_turn("t0").memory is None
    counters = store.counters()
    assert counters["memory:injected"] == 1 and counters["memory:dropped"] == 1


def test_m013_upgrades_a_database_with_turns(db):
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(migrations._CREATE_LEDGER)
    names = [name for name, _ in migrations.MIGRATIONS]
    for name, sql in migrations.MIGRATIONS[: names.index("m013_experiences")]:  # a database from before
        migrations._apply(conn, name, sql)
    conn.close()
    with Store.open(db) as s:
        s.upsert_session("s1", "header", 1.0)
        s.insert_turn(make_turn("t0", "s1", 0))
        assert s.get_turn("t0").memory is None
        assert s.learn("Answer in French.", "t0", "s1", now=1.0).id == 1
