"""Per-user figures (docs/users.md): the rows made from the store's grouped counts, /metrics' bounded
`user` label (the busiest users by turns, the rest summed as `other`), and a user's own row only."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from clawrl.api.metrics import Metrics
from clawrl.api.per_user import OTHER, UserRow, top_users, user_rows
from clawrl.api.state import Counts, PipelineState, Served, Snapshot, Stored, TrainerState
from clawrl.engine.base import EngineStats
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.types import Judgment, Vote
from tests.unit.test_store_training import sample

FIGURES = {
    "turns": {"alice": 30, "bob": 10, "carol": 5, "default": 1},
    "samples": {
        "alice": {"ready": 4, "trained": 20},
        "bob": {"ready": 1, "skipped": 2},
        "carol": {"ready": 2},
    },
    "versions": {"alice": {"passed": 3, "held": 1}, "carol": {"held": 2}},
    "memory": {"alice": 7, "dave": 1},
}
SERVED = {"alice": "alice/v3", "bob": "v0"}


def rows() -> list[UserRow]:
    return user_rows({"alice", "bob", "erin", "default"}, FIGURES, lambda u: SERVED.get(u, "v0"))


def test_rows_cover_every_user_busiest_first():
    r = rows()
    assert [x.user for x in r] == ["alice", "bob", "carol", "default", "dave", "erin"]
    alice = r[0]
    assert (alice.served, alice.turns, alice.ready, alice.trained) == ("alice/v3", 30, 4, 20)
    assert (alice.versions, alice.held, alice.memory) == (4, 1, 7)
    assert r[-1] == UserRow("erin", "v0")  # in the users file, nothing recorded yet


def test_top_users_sums_the_rest_as_other():
    top = top_users(rows(), n=2)
    assert [x.user for x in top] == ["alice", "bob", OTHER]
    other = top[-1]
    assert (other.served, other.turns, other.ready, other.held, other.memory) == ("", 6, 2, 2, 1)
    assert top_users(rows(), n=10) == rows()  # few enough users: no `other`


def scrape(users: list[UserRow]) -> dict[tuple[str, tuple], float]:
    counts = Counts(0, 0, 0, 0, 0, 0, 0, {})
    store = Stored(counts, [], 1, {}, [], [], users=users)
    snap = Snapshot(
        0.0, "clawrl", "combine", Served("v0"), EngineStats(), 4, None, TrainerState(None, None, None), store
    )

    class Fixed:
        async def snapshot(self):
            return snap

    text = asyncio.run(Metrics(Fixed()).scrape()).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_label_each_user():
    two = [UserRow("alice", "alice/v3", turns=30, ready=4, held=1, memory=7), UserRow("bob", "v0", turns=10)]
    m = scrape(two)
    assert m["clawrl_user_turns", (("user", "alice"),)] == 30
    assert m["clawrl_user_turns", (("user", "bob"),)] == 10
    assert m["clawrl_user_samples", (("status", "ready"), ("user", "alice"))] == 4
    assert m["clawrl_user_versions_held", (("user", "alice"),)] == 1
    assert m["clawrl_user_memory_items", (("user", "alice"),)] == 7
    assert m["clawrl_user_served_version", (("user", "alice"), ("version", "alice/v3"))] == 1
    assert not any(name.startswith("clawrl_user") for name, _ in scrape([]))  # users off: no family


def test_many_users_keep_the_label_bounded():
    many = [UserRow(f"u{i:03}", "v0", turns=1000 - i) for i in range(100)]
    m = scrape(top_users(many))
    users = {dict(labels)["user"] for name, labels in m if name == "clawrl_user_turns"}
    assert len(users) == 21 and OTHER in users
    assert m["clawrl_user_turns", (("user", OTHER),)] == sum(1000 - i for i in range(20, 100))


class OneEngine:
    """The engine's part `PipelineState` reads: its version, stats, and each user's served version."""

    version = "v0"

    def stats(self) -> EngineStats:
        return EngineStats()

    def version_of(self, user: str) -> str:
        return "alice/v1" if user == "alice" else "v0"


def test_the_store_counts_each_figure_by_user_and_a_user_sees_their_own_row(db):
    with Store.open(db) as s:
        s.upsert_session("a", "header", 1.0, user="alice")
        s.insert_turn(make_turn("t0", "a", 0))
        s.insert_turn(make_turn("t1", "a", 1))
        s.upsert_session("b", "header", 2.0, user="bob")
        s.insert_turn(make_turn("u0", "b", 0))
        s.insert_judgment(Judgment("t0", "j", [Vote("prm", 1)], 1, None), [sample("t0")])
    state = PipelineState(
        OneEngine(),
        model="m",
        method="combine",
        max_batch_size=4,
        batch_size=None,
        store_path=db,
        users=frozenset({"alice", "bob", "default"}),
    )
    snap = asyncio.run(state.snapshot())
    by_user = {r.user: r for r in snap.store.users}
    assert (by_user["alice"].turns, by_user["alice"].served) == (2, "alice/v1")
    assert by_user["alice"].ready + by_user["alice"].trained + by_user["alice"].skipped == 1
    assert (by_user["bob"].turns, by_user["bob"].ready) == (1, 0)
    assert [r.user for r in snap.store.users][:2] == ["alice", "bob"]
    own = asyncio.run(state.snapshot_for("bob"))
    assert [r.user for r in own.store.users] == ["bob"]
    state.close()
