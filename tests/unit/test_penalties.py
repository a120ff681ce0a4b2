"""Repetition penalties (engine/local/penalties.py): vLLM's and OpenAI's meaning, applied to the
draw only, never to the logprob the trainer compares against."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.engine.local.penalties import Penalties, PenaltyState
from clawrl.engine.local.sampling import RowSampler, sample_rows

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])


def test_repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    state = PenaltyState(Penalties(repetition=2.0), prompt_ids=[0, 1, 1])
    out = state.apply(LOGITS)
    assert out.tolist() == [1.0, -2.0, 0.5, 3.0, -2.0]  # 0 and 1 from the prompt; 2-4 untouched
    state.observe(3)  # a drawn token counts as seen too
    assert state.apply(LOGITS).tolist() == [1.0, -2.0, 0.5, 1.5, -2.0]
    assert LOGITS.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0]  # the input is not changed in place


def test_frequency_counts_and_presence_marks_drawn_tokens_only():
    state = PenaltyState(Penalties(frequency=0.5, presence=0.25), prompt_ids=[0, 1])
    assert state.apply(LOGITS).tolist() == LOGITS.tolist()  # the prompt does not count for these
    for token in (3, 3, 2):
        state.observe(token)
    assert state.apply(LOGITS).tolist() == [2.0, -1.0, 0.5 - 0.75, 3.0 - 1.25, -2.0]


def test_no_penalty_means_no_state():
    assert not Penalties().active and Penalties(presence=0.1).active
    assert RowSampler.create(0.0, 1.0, 0, None).penalty is None


def test_greedy_with_a_presence_penalty_stops_repeating_and_records_what_it_drew_from():
    """A greedy row whose logits never change draws token 3 forever; with presence 2.0 it moves on
    to the next best once 3 is drawn, and every recorded logprob is of the penalised distribution
    it was chosen from (the behaviour the trainer weighs against)."""
    logits = LOGITS[None]
    plain = RowSampler.create(0.0, 1.0, 0, None)
    assert [sample_rows(logits, [plain])[0].token_id for _ in range(3)] == [3, 3, 3]
    row = RowSampler.create(0.0, 1.0, 0, None, penalties=Penalties(presence=2.0), prompt_ids=[7])
    drawn = [sample_rows(logits, [row])[0] for _ in range(3)]
    assert [s.token_id for s in drawn] == [3, 0, 3]  # 3.0; then 2.0 > 3.0-2; then 3.0-2 > 2.0-2
    penalised = [LOGITS.clone() for _ in range(3)]
    penalised[1][3] -= 2.0  # after 3 was drawn once
    penalised[2][[0, 3]] -= 2.0  # after 3 and 0
    for s, shaped in zip(drawn, penalised, strict=True):
        assert s.logprob == pytest.approx(torch.log_softmax(shaped, dim=-1)[s.token_id].item(), abs=1e-6)
    assert drawn[1].logprob > torch.log_softmax(LOGITS, dim=-1)[0].item()  # not the model's own


def test_a_penalised_row_does_not_change_its_neighbours_draw():
    logits = LOGITS.repeat(2, 1)
    rows = [
        RowSampler.create(1.0, 1.0, 0, 11, penalties=Penalties(repetition=2.0), prompt_ids=[3]),
        RowSampler.create(1.0, 1.0, 0, 11),
    ]
    alone = RowSampler.create(1.0, 1.0, 0, 11)
    together = [sample_rows(logits, rows)[1].token_id for _ in range(20)]
    assert together == [sample_rows(LOGITS[None], [alone])[0].token_id for _ in range(20)]


def test_a_tiny_repetition_penalty_keeps_every_logprob_finite():
    """r = 5e-324 (the smallest float above 0, which the API accepts and the fuzzer sent) would
    make l / r infinite and the distribution undefined: the seen tokens get the largest finite
    logit instead, so they take all the mass and every logprob drawn and recorded is a number."""
    state = PenaltyState(Penalties(repetition=5e-324), prompt_ids=[0, 3])
    out = state.apply(LOGITS)
    assert torch.isfinite(out).all() and out[0] == out[3] == torch.finfo(out.dtype).max
    assert out[[1, 2, 4]].tolist() == [-1.0, 0.5, -2.0]  # unseen tokens are untouched
    row = RowSampler.create(1.0, 1.0, 2, None, penalties=Penalties(repetition=5e-324), prompt_ids=[0, 3])
    (drawn,) = sample_rows(LOGITS[None].clone(), [row])
    assert drawn.token_id in (0, 3) and math.isfinite(drawn.logprob)
    assert all(math.isfinite(lp) for _, lp in drawn.top)
