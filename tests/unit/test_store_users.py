"""Users in the store (m015, docs/users.md): sessions carry their user, samples copy it, and the reads
that answer for one user (ready samples, recent sessions, experiences) return that user's rows only."""

from __future__ import annotations

import sqlite3

from clawrl.store import migrations
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.types import Judgment, Sample


def sample(turn_id: str) -> Sample:
    return Sample(turn_id, "rl", [1, 2], [3], [-0.5], "v0", 1.0, reward=1.0)


def judged(store: Store, turn_id: str) -> list[int]:
    """A judgment of the turn with one ready sample; the sample's id."""
    store.insert_judgment(Judgment(turn_id, "feedback", [], 1, None, 2.0), [sample(turn_id)])
    return [s.id for s in store.ready_samples() if s.turn_id == turn_id]


def two_users(store: Store) -> None:
    """alice has session a1 (turn ta), bob has b1 (turn tb); d1 (turn td) is the default user's."""
    for session, user, turn in (("a1", "alice", "ta"), ("b1", "bob", "tb"), ("d1", None, "td")):
        if user is None:
            store.upsert_session(session, "header", 1.0)
        else:
            store.upsert_session(session, "header", 1.0, user)
        store.insert_turn(make_turn(turn, session))


def test_a_session_carries_its_user_and_an_unnamed_one_is_the_default(db):
    with Store.open(db) as store:
        two_users(store)
        users = [store.session_user(s) for s in ("a1", "b1", "d1", "nope")]
        assert users == ["alice", "bob", "default", None]
        store.upsert_session("a1", "header", 5.0, "alice")  # touched again: still alice's
        assert store.session_user("a1") == "alice"


def test_samples_copy_their_sessions_user_and_ready_samples_take_a_user(db):
    with Store.open(db) as store:
        two_users(store)
        a, b, d = judged(store, "ta"), judged(store, "tb"), judged(store, "td")
        assert [s.id for s in store.ready_samples(user="alice")] == a
        assert [s.id for s in store.ready_samples(user="bob")] == b
        assert [s.id for s in store.ready_samples(user="default")] == d
        assert store.ready_samples(user="carol") == []
        assert [s.id for s in store.ready_samples()] == a + b + d  # no user named: every user's
        assert [s.id for s in store.ready_samples(limit=1, user="bob")] == b
        store.claim_samples(b)  # bob's claimed sample is no longer ready for anyone
        assert store.ready_samples(user="bob") == []


def test_recent_sessions_answer_for_one_user_or_all(db):
    with Store.open(db) as store:
        two_users(store)
        assert [s["id"] for s in store.recent_sessions(10, user="alice")] == ["a1"]
        assert {s["id"]: s["user"] for s in store.recent_sessions(10)} == {
            "a1": "alice",
            "b1": "bob",
            "d1": "default",
        }


def test_a_lesson_belongs_to_its_sessions_user(db):
    with Store.open(db) as store:
        two_users(store)
        store.learn("The user prefers bullet points.", "ta", "a1", 3.0)
        store.learn("Keep answers short and to the point.", "tb", "b1", 3.0)
        assert [e.text for e in store.experiences("alice")] == ["The user prefers bullet points."]
        assert [e.owner for e in store.experiences(None)] == ["bob", "alice"]  # None: every owner's
        bobs = store.experiences("bob")[0].id
        assert store.forget(bobs, 4.0, owner="alice") is None  # not alice's to erase
        assert store.forget(bobs, 4.0, owner=None).state == "retired"  # the admin's


def test_m015_gives_the_rows_from_before_the_default_user(db):
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(migrations._CREATE_LEDGER)
    for name, sql in migrations.MIGRATIONS:
        if name != "m015_users":
            migrations._apply(conn, name, sql)
    conn.execute("INSERT INTO sessions (id, created_at, updated_at, source) VALUES ('old', 1, 1, 'header')")
    conn.close()
    with Store.open(db) as store:
        assert store.session_user("old") == "default"
        plan = store._read("EXPLAIN QUERY PLAN SELECT id FROM samples WHERE status = 'ready' AND user = 'x'")
        assert "samples_user_status" in " ".join(row["detail"] for row in plan)


def test_samples_of_a_set_of_users_are_read_and_counted(db):
    with Store.open(db) as store:
        two_users(store)
        a, d = judged(store, "ta"), judged(store, "td")
        judged(store, "tb")
        assert [s.id for s in store.ready_samples(users={"alice", "default"})] == a + d
        assert store.ready_samples(users=set()) == []
        assert store.count_samples("ready", users={"bob", "default"}) == 2
        assert store.count_samples(users={"bob"}) == 1 and store.count_samples("ready") == 3
        assert store.count_samples("trained", users={"bob"}) == 0
