"""A training step on a tiny model moves the measured behaviour, not just the weights."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.config import LoraConfig, TrainConfig
from clawrl.train.trainer import Trainer, triage
from clawrl.train.weights import LoraSettings, attach_lora
from clawrl.types import SKIP_REASONS, Sample

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]


def _model(tiny_model_dir, lr):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = LoraConfig(rank=8, alpha=16)
    model = attach_lora(base, LoraSettings(lora.rank, lora.alpha, lora.dropout, lora.targets))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    return model, optimizer


@torch.no_grad()
def _first_token_prob(model, token: int) -> float:
    logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    return torch.softmax(logits, -1)[token].item()


@torch.no_grad()
def _behaviour(model, response: list[int]) -> list[float]:
    ids = torch.tensor([PROMPT + response])
    logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def _samples(model, target: int, n: int = 8) -> list[Sample]:
    """Half the answers start with the target token (reward +1), half with another (-1)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        tail = torch.randint(100, 40000, (3,), generator=gen).tolist()
        first = target if i % 2 == 0 else int(torch.randint(100, 40000, (1,), generator=gen))
        response = [first, *tail]
        out.append(
            Sample(
                turn_id=f"t{i}",
                kind="rl",
                prompt_ids=PROMPT,
                response_ids=response,
                logprobs=_behaviour(model, response),
                version="v0",
                temperature=1.0,
                reward=1.0 if first == target else -1.0,
                id=i,
            )
        )
    return out


def test_rl_steps_raise_the_rewarded_tokens_probability(tiny_model_dir):
    model, optimizer = _model(tiny_model_dir, lr=5e-3)
    trainer = Trainer(model, optimizer, TrainConfig(kl_coef=0.02))
    target = 4093
    before = _first_token_prob(model, target)
    for _ in range(4):  # on-policy-ish: behaviour logprobs from the current policy each step
        metrics = trainer.step(_samples(model, target))
    after = _first_token_prob(model, target)
    assert after > 3 * before, (before, after)
    assert metrics["samples_rl"] == 8 and metrics["tokens"] == 32 and metrics["mean_reward"] == 0.0
    assert metrics["kl"] >= 0 and metrics["processed_tokens_per_s"] > metrics["tokens_per_s"] > 0
    # the ratio is to the step's own forward: a clip fraction would read 0 in every step
    assert not {"clip_frac", "dual_frac", "ratio_mean"} & metrics.keys()


def test_no_advantage_no_policy_gradient(tiny_model_dir):
    model, optimizer = _model(tiny_model_dir, lr=5e-3)
    trainer = Trainer(model, optimizer, TrainConfig(kl_coef=0.0))
    samples = _samples(model, 4093)
    for s in samples:
        s.reward = 0.0
    metrics = trainer.step(samples)
    assert metrics["pg_loss"] == pytest.approx(0.0) and metrics["grad_norm"] == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters() if p.requires_grad)


def test_triage_skips_defects_and_marks_stale():
    cfg = TrainConfig(max_staleness=1, max_seq_len=20)

    def sample(**kw):
        base = dict(
            turn_id="t",
            kind="rl",
            prompt_ids=[1, 2],
            response_ids=[3, 4],
            logprobs=[-1.0, -2.0],
            version="v3",
            temperature=1.0,
            reward=1.0,
        )
        return Sample(**{**base, **kw})

    good, old = sample(), sample(version="v1")
    empty, nan = sample(response_ids=[], logprobs=[]), sample(logprobs=[-1.0, float("nan")])
    long, opd = sample(prompt_ids=list(range(30))), sample(kind="opd", teacher_prompt_ids=None)
    t = triage([good, old, empty, nan, long, opd], current="v3", cfg=cfg)
    assert t.usable == [good] and t.stale == [(old, "made by v1, 2 training steps behind v3")]
    reasons = [r for _, r in t.skipped]
    assert reasons[0].startswith("empty response: ") and reasons[1].startswith("bad logprobs: non-finite")
    assert reasons[2] == "too long: 32 tokens > the training window 20 (train.max_seq_len)"
    assert reasons[3].startswith("no teacher prompt: ")
    assert all(r.split(":")[0] in SKIP_REASONS for r in reasons)  # the categories the store counts
    # The policy's config has the served window (train/sizing.py); None in a bare config: no bound.
    assert triage([long], current="v3", cfg=cfg.model_copy(update={"max_seq_len": 64})).usable == [long]
    assert triage([long], current="v3", cfg=TrainConfig()).usable == [long]


def test_every_token_is_weighted_by_its_truncated_importance_weight(tiny_model_dir):
    """w_t = min(pi_prox / mu, C) on every engine and sampler: behaviour logprobs 0.5 nats above the
    trainer's weigh each token exp(-0.5) (a top-k or penalised turn's mu is above pi); 1 nat below,
    exp(1) is truncated at C = 2; none recorded (an old store): weight 1, counted."""

    def run(shift: float | None, **cfg):
        model, optimizer = _model(tiny_model_dir, lr=1e-3)
        trainer = Trainer(model, optimizer, TrainConfig(kl_coef=0.0, **cfg))
        samples = _samples(model, 4093)
        for s in samples:
            s.logprobs = [] if shift is None else [x + shift for x in s.logprobs]
            s.logprobs_exact = False  # processed (vLLM's top-p): no longer trained "on-policy"
            s.reward = 1.0  # pg_loss = -mean(w_t * A_t): the weights' mean, with every A = 1
        return trainer.step(samples)

    exact, high, low, none = run(0.0), run(0.5), run(-1.0), run(None)
    assert exact["is_weight_mean"] == pytest.approx(1.0, abs=2e-3) and exact["mismatch"] < 2e-3
    assert high["is_weight_mean"] == pytest.approx(math.exp(-0.5), rel=2e-3)
    assert high["is_weight_min"] == pytest.approx(math.exp(-0.5), rel=2e-3)
    assert high["mismatch"] == pytest.approx(0.5, abs=2e-3) and high["mismatch_tokens"] == 32
    assert high["pg_loss"] == pytest.approx(math.exp(-0.5) * exact["pg_loss"], rel=1e-2)
    assert high["is_truncated_frac"] == 0.0 and high["mismatch_processed"] == pytest.approx(0.5, abs=2e-3)
    assert high["mismatch_exact"] is None and high["mismatch_exact_tokens"] == 0  # every one processed
    assert low["is_weight_mean"] == pytest.approx(2.0) and low["is_truncated_frac"] == 1.0
    assert low["is_truncated_samples"] == 8 and low["pg_loss"] == pytest.approx(
        2 * exact["pg_loss"], rel=1e-2
    )
    assert run(-1.0, is_cap=3.0)["is_weight_mean"] == pytest.approx(math.e, rel=2e-3)
    assert none["is_unweighted_samples"] == 8 and none["mismatch"] is None
    assert none["pg_loss"] == pytest.approx(exact["pg_loss"], rel=1e-2)


def test_a_cap_that_is_not_positive_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="is_cap"):
        TrainConfig(is_cap=0)


def test_opd_gap_quantiles_and_clipped_share_are_reported(tiny_model_dir):
    model, optimizer = _model(tiny_model_dir, lr=1e-3)
    trainer = Trainer(model, optimizer, TrainConfig(kl_coef=0.0, opd_clip=0.01))
    samples = _samples(model, 4093, n=4)
    for s in samples:  # a different prompt: the gap is anything but 0, and mostly past 0.01 nats
        s.kind, s.reward, s.teacher_prompt_ids = "opd", 0.0, PROMPT[:5] + [4093, 198]
    metrics = trainer.step(samples)
    assert metrics["samples_opd"] == 4 and metrics["opd_gap_clipped"] > 0.5
    assert metrics["opd_gap_p05"] <= metrics["opd_gap_p50"] <= metrics["opd_gap_p95"]
    assert trainer.step(_samples(model, 4093))["opd_gap_p50"] is None  # no opd: no gap


@pytest.mark.parametrize("opd_topk", [0, 8])
def test_micro_batches_give_the_same_step_as_one_batch(tiny_model_dir, opd_topk):
    """Packing changes memory, not the update: prompts of different lengths, rl and opd rows, a mask."""
    results = []
    for budget in (10_000, 1):  # all samples together; one sample per micro-batch
        torch.manual_seed(0)
        model, optimizer = _model(tiny_model_dir, lr=1e-2)
        cfg = TrainConfig(kl_coef=0.1, entropy_coef=0.01, micro_batch_tokens=budget, opd_topk=opd_topk)
        trainer = Trainer(model, optimizer, cfg)
        samples = _samples(model, 4093, n=4)
        for i, s in enumerate(samples):
            s.prompt_ids = PROMPT[i:]  # left padding differs per row
        samples[1].kind, samples[1].teacher_prompt_ids = "opd", PROMPT + [4093, 198]
        samples[2].response_ids, samples[2].logprobs = samples[2].response_ids[:2], samples[2].logprobs[:2]
        samples[3].loss_mask = [1, 0, 1, 1]
        metrics = trainer.step(samples)
        lora = [p.detach().clone() for n, p in model.named_parameters() if "lora_" in n]
        results.append((metrics, lora))
    (one, lora_one), (many, lora_many) = results
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "opd_topk_kl"):
        assert one[key] == pytest.approx(many[key], rel=1e-4, abs=1e-6), key
    assert one["tokens"] == many["tokens"] == 4 + 4 + 2 + 3
    # AdamW's first step moves each weight by about lr (1e-2) whatever the gradient's size, so float
    # noise in a near-zero gradient shows up as 1e-6 to 1.4e-5 in the weights (the most since the
    # opd gap is centred, train.opd_centre): compare to 0.5% of a step; a packing bug moves a whole one.
    diffs = [float((a - b).abs().max()) for a, b in zip(lora_one, lora_many, strict=True)]
    assert max(diffs) < 5e-5, diffs
    assert one["grad_norm"] > 0


def test_full_fine_tuning_in_bf16_keeps_float32_masters_that_hold_what_bf16_rounds_away(
    tiny_model_dir, tmp_path
):
    """train.precision "bf16" (full fine-tuning's default on a GPU, asked for here on a CPU): the
    model computes in bf16, as vLLM serves it; AdamW updates float32 masters, each bf16 weight is
    its master rounded once, so an update below bf16's resolution is kept in the master and not
    lost; the version folder holds the bf16 weights, and loading one sets the masters from it."""
    from clawrl.train.checkpoints import save_version
    from clawrl.train.policy import build_policy

    cfg = TrainConfig(weights="full", precision="bf16", lr=1e-4, kl_coef=0.0, opd_teacher="policy")
    policy = build_policy(tiny_model_dir, cfg, "cpu")
    master = policy.trainer.master
    assert master is not None and {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    assert all(m.dtype == torch.float32 for m in policy.optimizer.param_groups[0]["params"])
    before = [m.detach().clone() for m in master.params]
    metrics = policy.trainer.step(_samples(policy.model, target=4093))
    assert math.isfinite(metrics["loss"])
    moved = kept = 0
    for (weight, m), old in zip(master.pairs, before, strict=True):
        assert torch.equal(weight, m.to(torch.bfloat16))  # the bf16 weight is its master, rounded once
        changed = m != old
        moved += int(changed.sum())
        kept += int((changed & (m.to(torch.bfloat16).float() == old.to(torch.bfloat16).float())).sum())
    assert moved > 0 and kept > 0  # updates bf16 would have rounded away live on in the masters
    folder = save_version(
        tmp_path, "v1", policy.model, policy.optimizer, {"step": 1, "samples": 8, "metrics": {}}
    )
    policy.load(None)  # the base again: masters from its weights
    assert all(torch.equal(m, w.float()) for w, m in master.pairs)
    policy.load(folder)
    assert all(torch.equal(m, w.float()) for w, m in master.pairs)
    assert any(not torch.equal(w.float(), old) for (w, _), old in zip(master.pairs, before, strict=True))


def test_float32_is_full_fine_tunings_default_on_a_cpu_and_lora_never_has_masters(tiny_model_dir):
    from clawrl.train.policy import build_policy

    full = build_policy(tiny_model_dir, TrainConfig(weights="full", kl_coef=0.0), "cpu")
    assert full.trainer.master is None and {p.dtype for p in full.model.parameters()} == {torch.float32}
    lora = build_policy(tiny_model_dir, TrainConfig(precision="bf16"), "cpu")
    assert lora.trainer.master is None


def test_the_mismatch_is_split_by_cause_and_exact_is_the_numerics_alone(tiny_model_dir):
    """Four samples a cause, each cause's behaviour logprobs shifted by its own amount from the
    trainer's: `mismatch_exact` (same version, tempered, same prompt) reads only the numerics, the
    others their shift, and `mismatch` their token-weighted mean."""
    model, optimizer = _model(tiny_model_dir, lr=1e-3)
    samples = _samples(model, 4093, n=16)
    shifts = {"exact": 0.0, "stale": 0.4, "processed": 0.3, "conditioned": 0.2}
    for i, s in enumerate(samples):
        cause = list(shifts)[i % 4]
        s.logprobs = [x - shifts[cause] for x in s.logprobs]
        s.version = "v0" if cause == "stale" else "v1"
        s.logprobs_exact = cause != "processed"
        s.experience_ids = [7] if cause == "conditioned" else None
    metrics = Trainer(model, optimizer, TrainConfig(kl_coef=0.0)).step(samples, current="v1")
    assert metrics["mismatch_exact"] < 1e-4 and metrics["mismatch_exact_tokens"] == 16
    for cause in ("stale", "processed", "conditioned"):
        assert metrics[f"mismatch_{cause}"] == pytest.approx(shifts[cause], abs=1e-4), cause
    assert metrics["mismatch"] == pytest.approx(sum(shifts.values()) / 4, abs=1e-4)
    # without the version trained from, no sample can be told stale
    model, optimizer = _model(tiny_model_dir, lr=1e-3)
    alone = Trainer(model, optimizer, TrainConfig(kl_coef=0.0)).step(samples)
    assert alone["mismatch_stale"] is None and alone["mismatch_exact"] == pytest.approx(0.2, abs=1e-4)
