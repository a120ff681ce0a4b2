"""Judgments and samples in the store: round trips, superseding, statuses, restart queries, m002."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from clawrl.store import migrations
from clawrl.store.db import Store, StoreError, UnknownTurn
from clawrl.testing import make_turn
from clawrl.types import Feedback, Judgment, Sample, Version, Vote

VOTES = [
    Vote("prm", 1, "La réponse est juste. \\boxed{1}", None, 1.25),
    Vote("prm", -1, "Faux : 東京 n'est pas en Suisse. \\boxed{-1}", None, 0.5),
    Vote("prm", None, None, None, 30.0, "timeout after 30s"),  # the call itself failed
    Vote("prm", None, "je ne sais pas", None, 2.0, "unparseable: no \\boxed{}"),
    Vote("hint", 1, "[HINT_START]Donne l'unité — °C.[HINT_END]", "Donne l'unité — °C.", 3.5),
]


def judgment(turn_id: str = "t0", score: int | None = 1, created_at: float = 20.0, **kw) -> Judgment:
    return Judgment(turn_id, "openai:juge-🦉", list(VOTES), score, kw.pop("hint", None), created_at, **kw)


def sample(turn_id: str = "t0", kind: str = "rl", **kw) -> Sample:
    """A sample with every field away from its default, so a field lost on the way shows."""
    values = dict(
        turn_id=turn_id,
        kind=kind,
        prompt_ids=[1, 9690, 198, 2],
        response_ids=[504, 30, 2],
        logprobs=[-0.1, -1e-12, -12.345678901234567],
        version="v3",
        temperature=0.7,
        reward=-1.0,
        hint="Vérifie les unités 🌡️",
        teacher_prompt_ids=[1, 9690, 198, 77, 2],
        loss_mask=[1, 0, 1],
        judgment_id=None,
        rope_scaled=True,
        grammar={"kind": "tool_call", "lark": 'start: "{" "}"'},
        logprobs_exact=False,
        experience_id=7,
        rewrite=True,
        status="ready",
        created_at=1_700_000_002.25,
    )
    values.update(kw)
    return Sample(**values)


@pytest.fixture
def store(db: Path):
    """Session s1 with main turns t0..t2 and a side turn t3; session s2 with main turn u0."""
    with Store.open(db) as s:
        s.upsert_session("s1", "header", 1.0)
        for i in range(3):
            s.insert_turn(make_turn(f"t{i}", "s1", i, created_at=10.0 + i))
        s.insert_turn(make_turn("t3", "s1", 3, turn_type="side", created_at=13.0))
        s.upsert_session("s2", "body", 1.0)
        s.insert_turn(make_turn("u0", "s2", 0, created_at=5.0))
        yield s


def test_judgment_round_trip_keeps_failed_votes_and_unicode(store, db):
    assert store.latest_judgment("t0") is None and store.judgment_for("t0") is None
    first = judgment(hint="Donne l'unité — °C.")
    jid = store.insert_judgment(first)
    assert first.id == jid and jid > 0
    with Store.open(db, readonly=True) as reader:  # another process reads what the judge wrote
        assert reader.latest_judgment("t0") == first
    failed = store.latest_judgment("t0").votes[2]
    assert (failed.value, failed.raw, failed.error) == (None, None, "timeout after 30s")
    assert store.judgment_for("t0") == dataclasses.asdict(first)
    second = Judgment("t0", "feedback", [], None, None, 5.0)  # stamped earlier, written later
    store.insert_judgment(second)
    assert store.latest_judgment("t0") == second and second.id > jid
    with pytest.raises(UnknownTurn, match="nope"):
        store.insert_judgment(judgment("nope"))


def test_samples_round_trip_every_field(store):
    j = judgment()
    store.insert_judgment(j)
    # experience_ids: as a memory distillation sample has (no rule read here looks at it)
    full = [sample(judgment_id=j.id, experience_ids=[7, 8]), sample(kind="opd", reward=0.0, judgment_id=j.id)]
    for field in dataclasses.fields(Sample):  # the fixture sets every field but the two read by
        # ready_samples (statuses: see the counts below) and `attempts`, which the store counts
        if field.name not in ("id", "status", "attempts"):
            default = field.default_factory() if callable(field.default_factory) else field.default
            assert getattr(full[0], field.name) != default, field.name
    bare = Sample("t1", "rl", [1], [2], [-0.5], "v0", 1.0)  # defaults: None lists, no judgment
    ids = store.insert_samples([*full, bare])
    assert ids == [s.id for s in [*full, bare]] and ids == sorted(ids)
    assert store.ready_samples() == [*full, bare]
    assert store.insert_samples([]) == []


def test_bad_samples_are_refused_and_nothing_is_written(store):
    with pytest.raises(UnknownTurn, match="nope"):
        store.insert_samples([sample("t0"), sample("nope")])
    with pytest.raises(ValueError, match="kind"):
        store.insert_samples([sample(kind="grpo")])
    with pytest.raises(ValueError, match="status"):
        store.insert_samples([sample(status="done")])
    with pytest.raises(ValueError, match="of that turn"):
        store.insert_judgment(judgment("t0"), [sample("t1")])
    assert store.count_samples() == 0 and store.latest_judgment("t0") is None


def test_a_newer_judgment_supersedes_the_ready_samples(store):
    old = judgment(score=-1)
    made = [sample(judgment_id=None), sample(kind="opd"), sample()]
    store.insert_judgment(old, made[1:])  # written with its samples, in one transaction
    assert [s.judgment_id for s in made[1:]] == [old.id, old.id] and all(s.id for s in made[1:])
    store.insert_samples(made[:1])  # e.g. a sample made before any judgment
    store.set_sample_status([made[1].id], "trained")
    other = store.insert_samples([sample("t1")])  # another turn is left alone

    new = judgment(score=1)
    fresh = sample(judgment_id=None)
    store.insert_judgment(new, [fresh])
    assert {s.id for s in store.ready_samples()} == {fresh.id, *other}
    assert store.count_samples("superseded") == 2 and store.count_samples("trained") == 1
    assert store.supersede_samples("t0", new.id) == 0  # idempotent
    assert store.supersede_samples("t0", old.id) == 0  # never supersedes a newer judgment's samples

    store.insert_samples([sample(judgment_id=old.id)])  # late samples of the old judgment
    assert store.supersede_samples("t0", new.id) == 1
    assert store.count_samples("ready") == 2


def test_a_turn_already_trained_on_gets_no_second_sample_of_that_kind(store):
    first = sample()
    store.insert_judgment(judgment(score=-1), [first])
    store.set_sample_status([first.id], "trained")
    # The conversation goes on: the turn is judged again, with its next state this time.
    again, hinted = sample(), sample(kind="opd")
    later = judgment(score=1, hint="Use the unit")
    store.insert_judgment(later, [again, hinted])
    assert again.id is None and hinted.id is not None and hinted.judgment_id == later.id
    assert [s.id for s in store.ready_samples()] == [hinted.id]
    assert store.latest_judgment("t0").score == 1  # the judgment itself is recorded


def test_ready_samples_status_and_counts(store):
    ids = store.insert_samples(
        [sample(created_at=float(i), kind="rl" if i % 2 else "opd") for i in range(5)]
        + [sample(status="skipped")]
    )
    assert [s.id for s in store.ready_samples()] == ids[:5]
    assert [s.id for s in store.ready_samples(limit=2)] == ids[:2]
    store.set_sample_status(ids[:2], "trained")
    store.set_sample_status([ids[2], ids[2]], "stale")  # a repeated id is fine
    assert [s.id for s in store.ready_samples()] == ids[3:5]
    counts = {status: store.count_samples(status) for status in ("ready", "trained", "stale", "skipped")}
    assert counts == {"ready": 2, "trained": 2, "stale": 1, "skipped": 1}
    assert (store.count_samples(), store.count_samples(kind="rl"), store.count_samples("ready", "rl")) == (
        6,
        3,
        1,
    )
    late = store.insert_samples([sample(created_at=-1.0)])  # inserted last, stamped first
    assert [s.id for s in store.ready_samples()] == [*ids[3:5], *late]  # insertion order
    store.set_sample_status(late, "skipped")
    with pytest.raises(StoreError, match="1 of 2 sample ids are unknown"):
        store.set_sample_status([ids[3], 999], "trained")
    assert store.count_samples("ready") == 2  # the failed update changed nothing
    with pytest.raises(ValueError, match="status"):
        store.set_sample_status(ids, "deleted")
    store.set_sample_status([], "trained")


def test_session_rl_count(store):
    for status in ("ready", "trained", "stale", "skipped", "superseded"):
        store.insert_samples(
            [sample("t0", status=status), sample("t1", kind="opd", status=status, reward=0.0)]
        )
    store.insert_samples([sample("u0")])
    assert store.session_rl_count("s1") == 4  # every status but superseded; opd with no reward not counted
    store.insert_samples([sample("t2", kind="opd", reward=-1.0)])  # combine's: a hinted turn carrying r
    assert store.session_rl_count("s1") == 5
    assert store.session_rl_count("s2") == 1 and store.session_rl_count("nobody") == 0


def test_scored_turns_take_the_latest_judgment(store):
    store.insert_judgment(judgment("t2", score=-1))
    store.insert_judgment(judgment("t0", score=-1))
    latest = judgment("t0", score=0, created_at=1.0)  # the latest row, whatever its timestamp
    store.insert_judgment(latest)
    store.insert_judgment(judgment("u0"))
    scored = store.scored_turns("s1")
    assert [(turn.id, j.id) for turn, j in scored] == [("t0", latest.id), ("t2", scored[1][1].id)]
    assert scored[0] == (store.get_turn("t0"), latest)
    assert scored[0][0] == make_turn("t0", "s1", 0, created_at=10.0)
    assert store.scored_turns("nobody") == []


def test_turns_awaiting_judgment_survive_a_restart(db):
    with Store.open(db) as store:
        store.upsert_session("s1", "header", 1.0)
        store.insert_turn(make_turn("a", index=0, created_at=30.0))  # next state
        store.insert_turn(make_turn("b", index=1, created_at=20.0))  # feedback only, older
        store.insert_turn(make_turn("c", index=2, created_at=10.0))  # nothing to judge on
        store.insert_turn(make_turn("d", index=3, finish_reason="abort"))
        store.insert_turn(make_turn("e", index=4, turn_type="side"))
        store.insert_turn(make_turn("f", index=5))  # already judged
        for turn_id in "adef":
            store.set_next_state(turn_id, [{"role": "user", "content": "merci !"}], 40.0)
        store.add_feedback(Feedback("b", 1))
        store.insert_judgment(judgment("f"))
    with Store.open(db) as store:  # the server restarted
        waiting = store.turns_awaiting_judgment()
        assert [t.id for t in waiting] == ["b", "a"]
        assert waiting[1].next_state == [{"role": "user", "content": "merci !"}]
        store.insert_judgment(judgment("a"))
        assert [t.id for t in store.turns_awaiting_judgment()] == ["b"]


def test_m002_upgrades_a_database_made_by_m001(db, monkeypatch):
    with monkeypatch.context() as m:  # a store written by the first release
        # m001, plus the columns today's Turn is written with (m007's rope_scaled, m008's grammar,
        # m010's sampling, m012's memory, m016's next_state_match, m019's reasoning) and the session's
        # user (m015).
        keep = [migrations.MIGRATIONS[0], *migrations.MIGRATIONS[6:8], *migrations.MIGRATIONS[9:12:2]]
        later = ("m015_users", "m016_next_state_match", "m019_turn_reasoning")
        keep += [m for m in migrations.MIGRATIONS if m[0] in later]
        m.setattr(migrations, "MIGRATIONS", keep)
        with Store.open(db) as old:
            old.upsert_session("s1", "header", 1.0)
            old.insert_turn(make_turn("t0"))
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO samples (turn_id, kind, status, created_at, version, payload) "
            "VALUES ('t0', 'rl', 'ready', 1.0, 'v0', '{}')"
        )
        assert [r[0] for r in conn.execute("SELECT name FROM _migrations")] == [
            "m001_initial",
            "m007_turn_rope",
            "m008_turn_grammar",
            "m010_turn_sampling",
            "m012_turn_memory",
            "m015_users",
            "m016_next_state_match",
            "m019_turn_reasoning",
        ]
    with pytest.raises(StoreError, match="missing migrations: m002_sample_judgment_session"):
        Store.open(db, readonly=True)
    for _ in range(2):  # the upgrade, then a reopen that finds nothing to do
        with Store.open(db) as store:
            assert store.session_rl_count("s1") == 1  # session_id filled in for the old row
            assert store.get_turn("t0") == make_turn("t0")
    with sqlite3.connect(db) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY applied_at")]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert sorted(names) == sorted(name for name, _ in migrations.MIGRATIONS)
    assert {"samples_status", "samples_session_kind"} <= indexes


def test_claimed_samples_are_the_trainers_until_published_or_released(store):
    made = [sample("t0"), sample("t1"), sample("t2")]
    store.insert_samples(made)
    ids = [s.id for s in made]
    store.leave_out_samples({ids[2]: "stale"}, "stale")
    assert store.claim_samples(ids) == ids[:2]  # the stale one is not claimed
    assert store.claim_samples(ids) == []  # nor is anything twice
    store.insert_judgment(judgment("t0", score=-1))  # a newer judgment leaves the claimed sample be
    assert store.leave_out_samples({ids[1]: "late"}, "skipped") == 0
    assert [store.sample_status(i)[0] for i in ids] == ["training", "training", "stale"]
    with pytest.raises(StoreError, match="neither claimed nor ready: v1 cannot train them"):
        store.publish_version(Version("v1", 1, "/ckpt/v1"), trained=ids)
    assert store.latest_version().name == "v0" and store.count_samples("training") == 2  # nothing written
    assert store.release_samples() == 2  # t0 was judged meanwhile: superseded, t1 ready again
    assert [store.sample_status(i)[0] for i in ids] == ["superseded", "ready", "stale"]
    assert store.claim_samples([ids[1]]) == [ids[1]]
    store.publish_version(Version("v1", 1, "/ckpt/v1"), trained=[ids[1]])
    assert store.sample_status(ids[1])[0] == "trained" and store.release_samples() == 0
