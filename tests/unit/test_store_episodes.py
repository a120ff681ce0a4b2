"""Episodes and groups in the store (Track 2): recording, conflicts, closing once, restart query, counters."""

from __future__ import annotations

import pytest

from clawrl.store.db import EpisodeConflict, Store, UnknownSession
from clawrl.testing import make_turn
from clawrl.types import GROUP_OPEN, GROUP_USED, Episode, Sample


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "clawrl.db") as s:
        for i in range(3):
            s.insert_turn(make_turn(f"t{i}", f"s{i}"))
        yield s


def ep(session, reward=1.0, group="g1", size=2, **kw):
    return Episode(
        session, group, size, reward, kw.pop("reason", "answered"), task="calc-7", env="calculator", **kw
    )


def sample_of(turn_id):
    return Sample(turn_id, "rl", [1, 2], [3], [-0.5], "v0", 1.0, reward=0.7)


def test_an_episode_round_trips_and_its_group_counts_it(store):
    group = store.record_episode(ep("s0", 0.25, turns=3, tool_calls=2, info={"submitted": 12.5}))
    assert (group.id, group.size, group.received, group.status) == ("g1", 2, 1, GROUP_OPEN)
    back = store.group_episodes("g1")
    assert len(back) == 1 and back[0].reward == 0.25 and back[0].info == {"submitted": 12.5}
    assert (back[0].turns, back[0].tool_calls, back[0].task, back[0].group_size) == (3, 2, "calc-7", 2)
    assert store.session_episode("s0").id == back[0].id


def test_a_dropped_episode_keeps_its_reason(store):
    store.record_episode(ep("s0", None, reason="reward was nan"))
    (back,) = store.group_episodes("g1")
    assert back.reward is None and back.status == "dropped" and back.reason == "reward was nan"


def test_conflicts_and_unknown_sessions_are_refused_and_write_nothing(store):
    store.record_episode(ep("s0"))
    with pytest.raises(EpisodeConflict, match="already recorded"):
        store.record_episode(ep("s0"))
    with pytest.raises(EpisodeConflict, match="size 2, not 3"):
        store.record_episode(ep("s1", size=3))
    with pytest.raises(UnknownSession, match="nope"):
        store.record_episode(ep("nope"))
    assert [e.session_id for e in store.group_episodes("g1")] == ["s0"]


def test_a_group_closes_once_with_its_samples(store):
    store.record_episode(ep("s0", 1.0))
    store.record_episode(ep("s1", 0.0))
    assert store.complete_open_groups() == ["g1"]  # what a restart would close
    samples = [sample_of("t0"), sample_of("t1")]
    assert store.close_group("g1", GROUP_USED, None, (0.5, 0.7), samples)
    assert all(s.id for s in samples) and store.count_samples("ready") == 2
    assert not store.close_group("g1", GROUP_USED, None, (0.5, 0.7), [sample_of("t2")])  # never twice
    assert store.count_samples() == 2
    group = store.group("g1")
    assert (group.status, group.samples, group.reward_mean, group.received) == (GROUP_USED, 2, 0.5, 2)
    assert store.complete_open_groups() == []


def test_counters_follow_episodes_and_groups(store):
    store.record_episode(ep("s0", 1.0))
    store.record_episode(ep("s1", None))
    store.close_group("g1", "dropped", "1 episode(s) with a reward", (None, None), [])
    counters = dict(
        store._read("SELECT name, n FROM counters WHERE name LIKE 'episodes%' OR name LIKE 'groups%'")
    )
    assert counters == {
        "episodes": 2,
        "episodes:dropped": 1,
        "groups:used": 0,
        "groups:dropped": 1,
        "groups:eval": 0,
    }
