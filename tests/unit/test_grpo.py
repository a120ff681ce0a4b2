"""Tests for clawrl/algo/grpo.py: a complete group of episodes to samples, or why it is dropped."""

from __future__ import annotations

import math

import pytest

from clawrl.algo.grpo import EpisodeTurns, GroupRelative
from clawrl.testing import make_turn
from clawrl.types import GROUP_DROPPED, GROUP_USED, Judgment


def episode(reward, n_turns=1, tokens=3, session="s", side=0):
    turns = [
        make_turn(f"{session}-{i}", session, i, response_ids=list(range(tokens)), logprobs=[-0.5] * tokens)
        for i in range(n_turns)
    ]
    turns += [make_turn(f"{session}-side{i}", session, n_turns + i, turn_type="side") for i in range(side)]
    return EpisodeTurns(reward, turns)


def rewards_by_session(outcome):
    out = {}
    for s in outcome.samples:
        out.setdefault(s.turn_id.split("-")[0], []).append(s.reward)
    return out


def test_advantages_are_normalised_within_the_group():
    outcome = GroupRelative().group(
        [episode(1.0, session="a"), episode(0.0, session="b"), episode(0.0, session="c")]
    )
    assert outcome.status == GROUP_USED and outcome.reason is None
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # Bessel's correction, as TRL
    assert outcome.mean == pytest.approx(1 / 3) and outcome.std == pytest.approx(std)
    by = rewards_by_session(outcome)
    assert by["a"] == [pytest.approx((2 / 3) / (std + 1e-6))]
    assert by["b"] == by["c"] == [pytest.approx((-1 / 3) / (std + 1e-6))]
    assert all(s.kind == "rl" and s.judgment_id is None for s in outcome.samples)


def test_every_main_turn_of_an_episode_gets_its_advantage_and_side_turns_none():
    outcome = GroupRelative(normalize_std=False).group(
        [episode(1.0, n_turns=3, session="a", side=2), episode(0.0, n_turns=2, session="b")]
    )
    by = rewards_by_session(outcome)
    assert by == {"a": [0.5] * 3, "b": [-0.5] * 2}
    assert not any("side" in s.turn_id for s in outcome.samples)


@pytest.mark.parametrize(
    ("rewards", "reason"),
    [([1.0, 1.0, 1.0], "equal rewards (1)"), ([0.0, 0.0], "equal rewards (0)"), ([1.0], "1 episode(s)")],
)
def test_groups_without_a_signal_are_dropped(rewards, reason):
    outcome = GroupRelative().group([episode(r, session=f"s{i}") for i, r in enumerate(rewards)])
    assert outcome.status == GROUP_DROPPED and outcome.samples == []
    assert outcome.reason.startswith(reason)


def test_dropped_episodes_leave_the_statistics_and_give_no_sample():
    outcome = GroupRelative(normalize_std=False).group(
        [episode(1.0, session="a"), episode(None, session="b"), episode(0.0, session="c")]
    )
    assert outcome.mean == 0.5
    assert rewards_by_session(outcome) == {"a": [0.5], "c": [-0.5]}
    only_one = GroupRelative().group([episode(1.0, session="a"), episode(None, session="b")])
    assert only_one.status == GROUP_DROPPED


def test_the_judge_coefficient_is_read():
    a, b = episode(1.0, n_turns=2, session="a"), episode(0.0, session="b")
    a.judgments[a.turns[0].id] = Judgment(a.turns[0].id, "local:v0", [], score=-1, hint=None)
    off = rewards_by_session(GroupRelative(normalize_std=False).group([a, b]))
    on = rewards_by_session(GroupRelative(normalize_std=False, judge_coef=0.25).group([a, b]))
    assert off["a"] == [0.5, 0.5]
    assert on["a"] == [0.25, 0.5]  # the step the judge voted down loses c * 1
    assert GroupRelative(judge_coef=0.25).wants_prm and not GroupRelative().wants_prm


def test_episode_weighting_evens_out_long_and_short_episodes():
    long, short = (
        episode(1.0, n_turns=3, tokens=10, session="a"),
        episode(0.0, n_turns=1, tokens=10, session="b"),
    )
    weighted = GroupRelative(normalize_std=False, episode_weighting=True).group([long, short])
    by = rewards_by_session(weighted)
    # mean tokens 20: the long episode (30 tokens) is scaled by 2/3, the short one (10) by 2.
    assert by["a"] == [pytest.approx(0.5 * 2 / 3)] * 3 and by["b"] == [pytest.approx(-0.5 * 2)]
    total = {k: sum(abs(r) * 10 for r in v) for k, v in by.items()}  # token-weighted |A| per episode
    assert total["a"] == pytest.approx(total["b"])


def test_per_turn_judgments_alone_give_no_sample():
    turn = make_turn()
    assert GroupRelative().samples(turn, Judgment(turn.id, "x", [], 1, None), lambda t, h: []) == []
