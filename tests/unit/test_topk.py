"""OPD against the teacher's likeliest tokens (train/topk.py): the scores it reads and the term it adds."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from clawrl.config import TrainConfig
from clawrl.train import logprobs
from clawrl.train.logprobs import chunked_token_logprobs, chunked_topk
from clawrl.train.topk import topk_kl


def _logits(seed: int, b: int = 3, n: int = 6, v: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(b, n + 1, v, generator=gen, dtype=torch.float64)).requires_grad_(True)


@pytest.mark.parametrize("chunk_elements", [1, 200, 1 << 23])
def test_several_tokens_a_position_score_as_log_softmax_in_value_and_gradient(monkeypatch, chunk_elements):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk_elements)
    logits = _logits(0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (3, 6, 5), generator=gen)
    ids[..., 1] = ids[..., 0]  # the same token twice at a position: its gradient counts twice
    temps = torch.tensor([0.5, 0.0, 1.7])
    weights = torch.randn(3, 6, 5, generator=gen, dtype=torch.float64)
    logp, _ = chunked_token_logprobs(logits, ids, temps, with_entropy=False)
    (grad,) = torch.autograd.grad((logp * weights).sum(), logits)
    t = torch.where(temps > 0, temps, torch.ones_like(temps))[:, None, None]
    ref = torch.log_softmax(logits[:, :-1] / t, -1).gather(-1, ids)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    assert logp.shape == (3, 6, 5)
    torch.testing.assert_close(logp, ref)
    torch.testing.assert_close(grad, ref_grad)


def test_the_top_k_are_the_likeliest_tokens_with_their_log_probs(monkeypatch):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 100)
    logits = _logits(2).detach()
    ids, logp = chunked_topk(logits, torch.tensor([0.3, 1.0, 2.0]), 4, positions=6)
    ref = torch.log_softmax(logits[:, :-1] / torch.tensor([0.3, 1.0, 2.0])[:, None, None], -1).topk(4, -1)
    assert torch.equal(ids, ref.indices)
    torch.testing.assert_close(logp, ref.values)
    assert (logp[..., :-1] >= logp[..., 1:]).all()  # likeliest first


def test_the_term_is_the_forward_kl_over_the_teachers_tokens_and_pulls_the_student_to_them():
    teacher = torch.log_softmax(torch.tensor([[[2.0, 1.0, 0.0, -1.0]]]), -1)[..., :3]  # top 3 of 4
    student_full = torch.zeros(1, 1, 4, requires_grad=True)
    student = torch.log_softmax(student_full, -1)[..., :3]
    value = topk_kl(student, teacher, torch.ones(1, 1), num_tokens=2)
    q = teacher.exp()
    assert float(value.detach()) == pytest.approx(float((q * (teacher - student)).sum().detach() / 2))
    value.backward()
    grad = student_full.grad[0, 0]
    # d/dz_j = p_j * sum(q) - q_j: the teacher's favourite rises, the rest by how little it likes them
    assert grad[0] < 0 < grad[3] and grad[0] < grad[1] < grad[2] < grad[3]
    masked = topk_kl(student.detach(), teacher, torch.zeros(1, 1), num_tokens=2)
    assert float(masked) == 0.0  # a token outside the mask (padding, an rl sample) adds nothing
    assert float(topk_kl(teacher, teacher, torch.ones(1, 1), num_tokens=1)) == pytest.approx(0.0, abs=1e-7)


def test_misshaped_inputs_and_a_bad_k_are_refused():
    with pytest.raises(ValueError, match="do not line up"):
        topk_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2), 1)
    with pytest.raises(ValidationError, match="opd_topk"):
        TrainConfig(opd_topk=-1)
