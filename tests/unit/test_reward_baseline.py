"""The step's reward baseline (clawrl/train/baseline.py): all -1 steps carry no reward term."""

import pytest

from clawrl.train.baseline import centred
from clawrl.types import Sample


def _sample(reward: float, kind: str = "rl", **extra) -> Sample:
    """A one-token sample; `extra` sets or overrides any other field."""
    fields = {"turn_id": "t", "prompt_ids": [1], "response_ids": [2], "logprobs": [], "version": "v0"}
    return Sample(**{**fields, "temperature": 1.0, **extra}, kind=kind, reward=reward)


def test_a_step_of_minus_ones_carries_no_reward():
    out = centred([_sample(-1.0), _sample(-1.0, kind="opd"), _sample(-1.0)])
    assert [s.reward for s in out] == [0.0, 0.0, 0.0]


def test_one_good_answer_among_bad_ones_is_pushed_up_and_they_down():
    out = centred([_sample(1.0), _sample(-1.0), _sample(-1.0), _sample(-1.0)])
    assert out[0].reward == pytest.approx(2.0)
    assert [s.reward for s in out[1:]] == pytest.approx([-2 / 3] * 3)


def test_rewrites_and_distillations_keep_their_zero_and_do_not_count():
    rewrite = _sample(0.0, kind="opd", rewrite=True)
    distilled = _sample(0.0, kind="opd", experience_ids=[3])
    out = centred([_sample(-1.0), rewrite, _sample(1.0), distilled])
    assert [s.reward for s in out] == [-2.0, 0.0, 2.0, 0.0]


def test_none_or_a_single_judged_sample_is_left_as_judged():
    batch = [_sample(-1.0), _sample(0.0, kind="opd", rewrite=True)]
    assert [s.reward for s in centred(batch)] == [-1.0, 0.0]
    assert [s.reward for s in centred([_sample(1.0), _sample(-1.0)], "none")] == [1.0, -1.0]
    with pytest.raises(ValueError, match="unknown reward baseline"):
        centred(batch, "mean")


def test_an_own_answers_gap_is_centred_and_a_rewrites_is_not():
    """train.opd_centre: the policy's own answer loses its gaps' mean (no net push down); a rewrite,
    the teacher's own answer, keeps them; an rl sample has no gap."""
    import torch

    from clawrl.train.advantages import batch_advantages

    own = _sample(
        0.0, "opd", turn_id="a", response_ids=[2, 3, 4], teacher_prompt_ids=[1, 9], loss_mask=[1, 1, 0]
    )
    rewrite = _sample(
        0.0, "opd", turn_id="a", response_ids=[5, 6, 7], teacher_prompt_ids=[1, 9], rewrite=True
    )
    student = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    # gaps -0.5, 0.1, -1 (clipped); 0.5, 0.1, 0
    teacher = torch.tensor([[-1.5, -0.9, -3.0], [-1.5, -1.9, -2.0]])
    on = batch_advantages([own, rewrite], student, teacher, opd_centre=True)
    off = batch_advantages([own, rewrite], student, teacher, opd_centre=False)
    assert off[0].tolist() == pytest.approx([-0.5, 0.1, -1.0])
    assert on[0].tolist() == pytest.approx([-0.3, 0.3, -0.8])  # less -0.2, the mean of the trained two
    assert on[1].tolist() == pytest.approx(off[1].tolist())
    assert off[1].tolist() == pytest.approx([0.5, 0.1, 0.0])
