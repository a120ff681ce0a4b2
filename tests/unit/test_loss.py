"""Tests for clawrl.train.loss and clawrl.train.advantages, against values worked out by hand.

Ratios are set directly: old_logp = -1 and logp = old_logp + log(rho), so rho_t is
the number written in each case. Gradients are taken w.r.t. logp with autograd.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from clawrl.train.advantages import GapStats, advantages, batch_advantages
from clawrl.train.loss import policy_loss, token_logprobs
from clawrl.types import Sample

F64 = torch.float64


def t(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=F64)


def with_ratios(rhos: list[list[float]]) -> tuple[Tensor, Tensor]:
    """(logp with a graph, old_logp) such that exp(logp - old_logp) = rhos."""
    old = torch.full((len(rhos), len(rhos[0])), -1.0, dtype=F64)
    logp = (old + t(rhos).log()).requires_grad_()
    return logp, old


def grad(loss: Tensor, x: Tensor) -> Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


def close(actual: Tensor | float | None, expected: list[list[float]] | list[float] | float) -> None:
    assert actual is not None
    if isinstance(actual, Tensor):
        actual = actual.detach()
    torch.testing.assert_close(torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64))


# The worked example: 2 sequences x 3 tokens, the last token of row 1 is padding.
#   token  rho   A    min(rho*A, clip(rho, 0.8, 1.28)*A)   taken     d(-s/N)/dlogp = -A*rho/N
#   0,0    1.5  +1    min(1.5, 1.28)   = 1.28               clipped   0
#   0,1    1.1  +1    min(1.1, 1.1)    = 1.1                inside    -1.1/5 = -0.22
#   0,2    0.5  -1    min(-0.5, -0.8)  = -0.8               clipped   0
#   1,0    1.0  -1    -1.0                                  inside    +1.0/5 = +0.2
#   1,1    0.7  +1    min(0.7, 0.8)    = 0.7                unclipped -0.7/5 = -0.14 (A>0 lets it rise)
#   1,2    pad
# sum s = 1.28; N = 5; L_pg = -0.256; clip_frac = 2/5; ratio_mean = 4.8/5 = 0.96.
RHOS = [[1.5, 1.1, 0.5], [1.0, 0.7, 1.0]]
ADV = [[1.0, 1.0, -1.0], [-1.0, 1.0, 1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_worked_example_loss_gradient_and_metrics() -> None:
    logp, old = with_ratios(RHOS)
    terms = policy_loss(logp, old, t(ADV), t(MASK))
    close(terms.loss, -0.256)
    close(terms.pg_loss, -0.256)
    close(grad(terms.loss, logp), [[0.0, -0.22, 0.0], [0.2, -0.14, 0.0]])
    close(terms.clip_frac, 0.4)
    close(terms.ratio_mean, 0.96)
    assert int(terms.tokens) == 5
    assert terms.kl == 0.0 and terms.entropy == 0.0  # not given
    assert terms.metrics() == pytest.approx(
        {
            "pg_loss": -0.256,
            "kl": 0.0,
            "entropy": 0.0,
            "clip_frac": 0.4,
            "dual_frac": 0.0,
            "ratio_mean": 0.96,
            "tokens": 5,
        }
    )
    assert not terms.pg_loss.requires_grad and not terms.clip_frac.requires_grad


def test_high_side_clip_stops_the_gradient_of_a_positive_advantage() -> None:
    logp, old = with_ratios([[1.5, 1.1]])
    terms = policy_loss(logp, old, t([[2.0, 2.0]]), t([[1.0, 1.0]]))
    close(terms.loss, -(1.28 * 2 + 1.1 * 2) / 2)
    close(grad(terms.loss, logp), [[0.0, -2.0 * 1.1 / 2]])
    close(terms.clip_frac, 0.5)


def test_low_side_clip_stops_the_gradient_of_a_negative_advantage() -> None:
    logp, old = with_ratios([[0.5, 0.9]])
    terms = policy_loss(logp, old, t([[-1.0, -1.0]]), t([[1.0, 1.0]]))
    close(terms.loss, -(-0.8 - 0.9) / 2)  # rho=0.5 is held at 1-eps=0.8
    close(grad(terms.loss, logp), [[0.0, 0.9 / 2]])  # -A*rho/N = +0.45 for the one inside
    close(terms.clip_frac, 0.5)


def test_ratios_outside_the_region_against_the_advantage_are_not_clipped() -> None:
    # A>0 with rho<1-eps, A<0 with rho>1+eps_high: the unclipped term is the smaller; gradient flows.
    logp, old = with_ratios([[0.5, 1.5]])
    terms = policy_loss(logp, old, t([[1.0, -1.0]]), t([[1.0, 1.0]]))
    close(grad(terms.loss, logp), [[-0.5 / 2, 1.5 / 2]])
    close(terms.clip_frac, 0.0)


def test_clipping_bounds_are_asymmetric() -> None:
    # Upper bound 1 + 0.28: rho=1.25 is inside, 1.3 is clipped. Lower bound 1 - 0.2: 0.85 inside, 0.75 not.
    logp, old = with_ratios([[1.25, 1.3, 0.85, 0.75]])
    terms = policy_loss(logp, old, t([[1.0, 1.0, -1.0, -1.0]]), t([[1.0] * 4]))
    close(grad(terms.loss, logp), [[-1.25 / 4, 0.0, 0.85 / 4, 0.0]])
    close(terms.clip_frac, 0.5)
    # A symmetric eps=0.2 would have clipped rho=1.25.
    logp, old = with_ratios([[1.25]])
    close(grad(policy_loss(logp, old, t([[1.0]]), t([[1.0]]), eps_high=0.2).loss, logp), [[0.0]])


def test_masked_token_changes_nothing_even_with_absurd_values() -> None:
    logp, old = with_ratios(RHOS)
    ref = old.clone()
    entropy = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    clean = policy_loss(logp, old, t(ADV), t(MASK), ref, entropy, entropy_coef=0.1)
    clean_grad = grad(clean.loss, logp)

    old_bad, adv_bad, ref_bad, ent_bad = old.clone(), t(ADV), ref.clone(), entropy.clone()
    old_bad[1, 2] = -1e4  # rho = exp(1e4 - 1) = inf
    adv_bad[1, 2] = float("nan")
    ref_bad[1, 2] = 1e4  # exp(d) = inf
    ent_bad[1, 2] = float("inf")
    bool_mask = t(MASK).bool()
    dirty = policy_loss(logp, old_bad, adv_bad, bool_mask, ref_bad, ent_bad, entropy_coef=0.1)
    dirty_grad = grad(dirty.loss, logp)

    assert torch.isfinite(dirty.loss) and torch.isfinite(dirty_grad).all()
    close(dirty.loss, clean.loss.item())
    close(dirty_grad, clean_grad.tolist())
    assert dirty_grad[1, 2] == 0.0
    assert dirty.metrics() == clean.metrics()


def test_mean_is_over_tokens_of_the_whole_batch_not_per_sequence() -> None:
    # Row 0 has 3 tokens with A=+1, row 1 one token with A=-1, all at rho=1.
    # Token-level: -(1+1+1-1)/4 = -0.5 (a mean of sequence means would give -(1 + -1)/2 = 0).
    logp, old = with_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = t([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    terms = policy_loss(logp, old, adv, mask)
    close(terms.loss, -0.5)
    close(grad(terms.loss, logp), [[-0.25, -0.25, -0.25], [0.25, 0.0, 0.0]])  # every token weighs 1/N


def test_micro_batches_with_the_step_token_count_add_up_to_the_whole_batch() -> None:
    logp, old = with_ratios(RHOS)
    whole = policy_loss(logp, old, t(ADV), t(MASK))
    parts = [
        policy_loss(logp[i : i + 1], old[i : i + 1], t(ADV)[i : i + 1], t(MASK)[i : i + 1], num_tokens=5)
        for i in (0, 1)
    ]
    close(parts[0].loss + parts[1].loss, whole.loss.item())
    close(parts[0].clip_frac + parts[1].clip_frac, whole.clip_frac.item())
    close(grad(parts[0].loss + parts[1].loss, logp), grad(whole.loss, logp).tolist())


def test_advantages_broadcast_per_sequence() -> None:
    logp, old = with_ratios([[1.0, 1.1], [1.0, 0.9]])
    per_token = policy_loss(logp, old, t([[1.0, 1.0], [-2.0, -2.0]]), t([[1.0, 1.0], [1.0, 1.0]]))
    per_seq = policy_loss(logp, old, t([[1.0], [-2.0]]), t([[1.0, 1.0], [1.0, 1.0]]))
    close(per_seq.loss, per_token.loss.item())


def test_k3_kl_value_and_gradient_pull_toward_the_reference() -> None:
    # d = ref - logp = +ln2: k3 = 2 - ln2 - 1 = 1 - ln2;  d = -ln2: k3 = 1/2 + ln2 - 1 = ln2 - 1/2.
    # mean = (1 - ln2 + ln2 - 1/2)/2 = 1/4.  d k3/d logp = 1 - exp(d): -1 and +1/2, over N = 2.
    logp = t([[-2.0, -1.0]]).requires_grad_()
    ref = logp.detach() + t([[math.log(2.0), -math.log(2.0)]])
    zero = t([[0.0, 0.0]])
    terms = policy_loss(logp, logp.detach(), zero, t([[1.0, 1.0]]), ref, kl_coef=0.1)
    close(terms.kl, 0.25)
    close(terms.loss, 0.1 * 0.25)
    g = grad(terms.loss, logp)
    close(g, [[0.1 * -0.5, 0.1 * 0.25]])
    assert g[0, 0] < 0 < g[0, 1]  # descent raises the token below ref and lowers the one above

    no_kl = policy_loss(logp, logp.detach(), zero, t([[1.0, 1.0]]), ref, kl_coef=0.0)
    close(no_kl.loss, 0.0)  # reported, not trained on
    close(no_kl.kl, 0.25)
    same = policy_loss(logp, logp.detach(), zero, t([[1.0, 1.0]]), logp.detach())
    close(same.kl, 0.0)


def test_entropy_bonus_is_subtracted_as_a_token_mean() -> None:
    # mean H over the 5 real tokens = (1 + 2 + 3 + 0.5 + 0.5)/5 = 1.4; loss = -0.1 * 1.4.
    logp, old = with_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    entropy = t([[1.0, 2.0, 3.0], [0.5, 0.5, 99.0]]).requires_grad_()
    zero = torch.zeros(2, 3, dtype=F64)
    terms = policy_loss(logp, old, zero, t(MASK), entropy=entropy, entropy_coef=0.1)
    close(terms.entropy, 1.4)
    close(terms.loss, -0.14)
    close(grad(terms.loss, entropy), [[-0.02, -0.02, -0.02], [-0.02, -0.02, 0.0]])
    off = policy_loss(logp, old, zero, t(MASK), entropy=entropy)
    close(off.loss, 0.0)
    close(off.entropy, 1.4)


def test_only_logp_carries_gradient() -> None:
    logp, old = with_ratios(RHOS)
    old.requires_grad_()
    adv = t(ADV).requires_grad_()
    ref = (old.detach() + 0.3).requires_grad_()
    loss = policy_loss(logp, old, adv, t(MASK), ref).loss
    grads = torch.autograd.grad(loss, [old, adv, ref], allow_unused=True)
    assert all(g is None for g in grads)


def test_all_padding_gives_zero_loss_that_backprops() -> None:
    logp, old = with_ratios(RHOS)
    terms = policy_loss(logp, old, t(ADV), torch.zeros(2, 3))
    close(terms.loss, 0.0)
    close(grad(terms.loss, logp), [[0.0] * 3] * 2)
    assert int(terms.tokens) == 0


def test_mismatched_shapes_are_refused() -> None:
    logp, old = with_ratios(RHOS)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(logp, old, t(ADV), torch.ones(2, 2))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, torch.ones(3, 3), t(MASK))


# --- token_logprobs -------------------------------------------------------------------------


def test_token_logprobs_by_hand() -> None:
    # logits (0, ln 3) at T=1: p = (1/4, 3/4). At T=0.5: logits (0, 2 ln 3), p = (1/10, 9/10).
    logits = t([[0.0, math.log(3.0)]])[None]  # [1, 1, 2]
    targets = torch.tensor([[1]])
    logp, entropy = token_logprobs(logits, targets, 1.0)
    close(logp, [[math.log(0.75)]])
    close(entropy, [[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]])
    logp, entropy = token_logprobs(logits, targets, 0.5)
    close(logp, [[math.log(0.9)]])
    close(entropy, [[-(0.1 * math.log(0.1) + 0.9 * math.log(0.9))]])


def test_token_logprobs_match_log_softmax_with_temperature() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=F64, requires_grad=True)
    targets = torch.randint(0, 7, (2, 3), generator=gen)
    logp, entropy = token_logprobs(logits, targets, 0.7)
    ref = torch.log_softmax(logits / 0.7, dim=-1)
    close(logp, ref.gather(-1, targets[..., None])[..., 0].tolist())
    close(entropy, torch.distributions.Categorical(logits=logits / 0.7).entropy().tolist())
    # d logp / d logits = (onehot - p) / T
    expected = (torch.nn.functional.one_hot(targets, 7) - ref.exp()) / 0.7
    close(grad(logp.sum(), logits), expected.tolist())


def test_temperature_zero_means_one_and_can_differ_per_sequence() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=F64)
    targets = torch.randint(0, 5, (2, 3), generator=gen)
    close(token_logprobs(logits, targets, 0.0)[0], token_logprobs(logits, targets, 1.0)[0].tolist())
    mixed, _ = token_logprobs(logits, targets, torch.tensor([0.5, 0.0]))
    close(mixed[0], token_logprobs(logits, targets, 0.5)[0][0].tolist())
    close(mixed[1], token_logprobs(logits, targets, 1.0)[0][1].tolist())


def test_half_precision_logits_are_scored_in_float32() -> None:
    logits = torch.randn(1, 2, 4).to(torch.bfloat16)
    logp, entropy = token_logprobs(logits, torch.tensor([[0, 3]]), 1.0)
    assert logp.dtype == entropy.dtype == torch.float32


# --- advantages -----------------------------------------------------------------------------


def sample(kind: str, n: int, reward: float = 0.0) -> Sample:
    return Sample("chatcmpl-1", kind, [1, 2], list(range(n)), [-1.0] * n, "v0", 1.0, reward=reward)  # type: ignore[arg-type]


OLD = torch.tensor([-1.0, -1.0, -3.0], dtype=F64)
TEACHER = torch.tensor([-0.5, -2.0, -3.0], dtype=F64)


def test_rl_advantage_is_the_weighted_reward_on_every_token() -> None:
    close(advantages("rl", -1.0, OLD, None, w_rl=0.5), [-0.5, -0.5, -0.5])
    close(advantages("rl", 1.0, OLD, TEACHER), [1.0, 1.0, 1.0])  # a teacher is ignored


def test_opd_advantage_is_the_weighted_clipped_gap_plus_the_weighted_reward() -> None:
    # teacher - student = (0.5, -1, 0), times w_opd = 2; unclipped (opd_clip 0), then clipped at 1 nat
    close(advantages("opd", 0.0, OLD, TEACHER, w_opd=2.0, opd_clip=0.0), [1.0, -2.0, 0.0])
    far = torch.tensor([-0.5, -9.0, -3.0], dtype=F64)  # a token the hint contradicts: -8 nats
    close(advantages("opd", 0.0, OLD, far), [0.5, -1.0, 0.0])
    close(advantages("opd", 0.0, OLD, far, opd_clip=0.25), [0.25, -0.25, 0.0])
    # combine's one sample per turn: the reward is added to every token's clipped gap
    close(advantages("opd", -1.0, OLD, far, w_rl=0.5, w_opd=2.0), [-0.5 + 1.0, -0.5 - 2.0, -0.5])
    with pytest.raises(ValueError, match="teacher_logp"):
        advantages("opd", 0.0, OLD, None)
    with pytest.raises(ValueError, match="unknown sample kind"):
        advantages("ppo", 1.0, OLD, None)


def test_advantages_are_constants() -> None:
    old, teacher = OLD.clone().requires_grad_(), TEACHER.clone().requires_grad_()
    assert not advantages("opd", 0.0, old, teacher).requires_grad


def test_gap_stats_give_quantiles_and_the_clipped_share() -> None:
    stats = GapStats(limit=1.0)
    student = torch.zeros(2, 4, dtype=F64)
    teacher = torch.tensor([[0.5, -6.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]], dtype=F64)
    batch_advantages([sample("opd", 4), sample("opd", 1)], student, teacher, stats=stats)
    m = stats.metrics()
    assert m["opd_gap_clipped"] == pytest.approx(2 / 5)  # -6 and +2 of the 5 real opd tokens
    assert m["opd_gap_p05"] < -1 < 0 == m["opd_gap_p50"] < 1 < m["opd_gap_p95"]
    assert set(GapStats(1.0).metrics().values()) == {None}  # a step without opd tokens


def test_batch_advantages_pad_with_zeros_and_need_a_teacher_for_opd() -> None:
    old = torch.full((2, 3), -1.0, dtype=F64)
    adv = batch_advantages([sample("rl", 3, reward=-1.0), sample("rl", 1, reward=1.0)], old, None)
    close(adv, [[-1.0, -1.0, -1.0], [1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="teacher_logp"):
        batch_advantages([sample("opd", 2)], old[:1], None)
    with pytest.raises(ValueError, match="response tokens"):
        batch_advantages([sample("rl", 4, reward=1.0)], old[:1], None)


def test_dual_clip_bounds_a_negative_advantage_token_whose_ratio_ran_away() -> None:
    # ratio 5 on a token with A = -1: plain PPO takes -5 (unbounded as the ratio grows); dual-clip 3 takes -3
    logp, old = with_ratios([[5.0, 1.0]])
    plain = policy_loss(logp, old, t([[-1.0, -1.0]]), t([[1.0, 1.0]]), dual_clip=0.0)
    close(plain.loss, (5.0 + 1.0) / 2)
    logp, old = with_ratios([[5.0, 1.0]])
    dual = policy_loss(logp, old, t([[-1.0, -1.0]]), t([[1.0, 1.0]]))
    close(dual.loss, (3.0 + 1.0) / 2)
    close(grad(dual.loss, logp), [[0.0, 0.5]])  # the bounded token gives no gradient
    close(dual.dual_frac, 0.5)
    logp, old = with_ratios([[5.0]])  # a positive advantage is never dual-clipped
    close(policy_loss(logp, old, t([[1.0]]), t([[1.0]])).dual_frac, 0.0)


def test_k3_is_clamped_per_token() -> None:
    logp = torch.tensor([[-20.0, -1.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0]], dtype=F64)  # d = 19 on the first token: exp(19) unclamped
    terms = policy_loss(logp, logp.detach(), t([[0.0, 0.0]]), t([[1.0, 1.0]]), ref_logp=ref, kl_clamp=10.0)
    close(terms.kl, 10.0 / 2)
    close(grad(terms.loss, logp), [[0.0, 0.0]])  # the clamped token carries no KL gradient
