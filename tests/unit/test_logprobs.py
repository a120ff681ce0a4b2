"""Chunked log-probs (train/logprobs.py) are the unchunked ones (loss.token_logprobs), gradients too."""

from __future__ import annotations

import pytest
import torch

from clawrl.train import logprobs
from clawrl.train.logprobs import chunked_token_logprobs
from clawrl.train.loss import token_logprobs


def _case(seed: int, b: int = 3, n: int = 7, v: int = 50, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(b, n + 1, v, generator=gen)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (b, n), generator=gen)
    temps = torch.tensor([0.7, 0.0, 1.3])[:b]
    weights = torch.randn(2, b, n, generator=gen, dtype=torch.float64)  # d loss / d (logp, entropy)
    return logits, targets, temps, weights


@pytest.mark.parametrize("chunk_elements", [1, 300, 1 << 23])  # one position per chunk, a few, all at once
def test_chunked_and_unchunked_logprobs_agree_in_value_and_gradient(monkeypatch, chunk_elements):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk_elements)
    logits, targets, temps, (w_logp, w_ent) = _case(0)
    logp, entropy = chunked_token_logprobs(logits, targets, temps)
    (g_chunked,) = torch.autograd.grad((logp * w_logp).sum() + (entropy * w_ent).sum(), logits)
    ref_logp, ref_entropy = token_logprobs(logits[:, :-1], targets, temps)
    (g_ref,) = torch.autograd.grad((ref_logp * w_logp).sum() + (ref_entropy * w_ent).sum(), logits)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)
    torch.testing.assert_close(g_chunked, g_ref)
    assert g_chunked[:, -1].abs().max() == 0  # the position after the last target predicts nothing


def test_logp_alone_has_the_logp_gradient_and_no_entropy():
    logits, targets, temps, (w_logp, _) = _case(1)
    logp, entropy = chunked_token_logprobs(logits, targets, temps, with_entropy=False)
    assert not entropy.requires_grad and entropy.abs().max() == 0
    (g,) = torch.autograd.grad((logp * w_logp).sum(), logits)
    ref_logp, _ = token_logprobs(logits[:, :-1], targets, temps)
    (g_ref,) = torch.autograd.grad((ref_logp * w_logp).sum(), logits)
    torch.testing.assert_close(g, g_ref)


def test_float32_and_bfloat16_logits_score_in_float32_like_the_unchunked():
    logits, targets, temps, _ = _case(2, dtype=torch.bfloat16)
    logp, entropy = chunked_token_logprobs(logits.detach(), targets, temps)
    ref_logp, ref_entropy = token_logprobs(logits.detach()[:, :-1], targets, temps)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)
