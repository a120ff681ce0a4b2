"""A shared prompt prefix computed once (clawrl/train/sharing.py): the same logprobs, gradients and
step as every row running its whole prompt, for fewer tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.config import TrainConfig
from clawrl.train.batch import left_pad, score
from clawrl.train.packing import loss_positions, pack_prefixes, unpack
from clawrl.train.sharing import block_attention, share_prefixes
from clawrl.train.trainer import Trainer
from clawrl.types import Sample
from tests.unit.test_trainer import _model

SYSTEM = torch.randint(100, 5000, (150,), generator=torch.Generator().manual_seed(0)).tolist()  # the agent's


def turn(prompt: list[int], response: list[int], i: int, **kw) -> Sample:
    gen = torch.Generator().manual_seed(i)
    logprobs = (-8.5 + 0.3 * torch.randn(len(response), generator=gen)).tolist()
    fields = {"reward": 1.0 if i % 2 else -1.0, "rope_scaled": False} | kw
    return Sample(f"t{i}", "rl", prompt, response, logprobs, "v0", 1.0, id=i, **fields)


def openclaw_turns() -> list[Sample]:
    """Three conversations behind one system prompt, one of them two turns long (packed as a session)."""
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(5000, 9000, (n,), generator=gen).tolist()  # none starts like the prompt

    a = turn(SYSTEM + ids(20), ids(6), 0)
    b = turn(SYSTEM + ids(9), ids(4), 1)
    a2 = turn(a.prompt_ids + a.response_ids + ids(7), ids(5), 2)
    c = turn(SYSTEM + ids(31), ids(3), 3)
    return [a, b, a2, c]


def mixed_turns() -> list[Sample]:
    """openclaw_turns and a conversation behind another prompt: a merged row beside a row alone (a
    hint rewrite and its turn share their prompt; the step's other samples need not)."""
    other = torch.randint(9000, 12000, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    return [*openclaw_turns(), turn(other, [11, 12, 13, 14], 4)]


def test_rows_behind_one_system_prompt_share_one_row():
    samples = openclaw_turns()
    alone = pack_prefixes(samples)
    layout = share_prefixes(alone, samples, budget=2048)
    assert len(alone.members) == 3 and len(layout.members) == 1
    assert layout.prompts[0] == SYSTEM and len(layout.starts[0]) == 3
    for i, s in enumerate(samples):  # each answer sits at its offset in its row's response
        response = layout.responses[layout.row_of[i]]
        assert response[layout.offsets[i] : layout.offsets[i] + len(s.response_ids)] == s.response_ids
    assert layout.tokens == alone.tokens - 2 * len(SYSTEM)
    tight = share_prefixes(alone, samples, budget=80)  # remainders past the prompt: 13, 38 (a session), 34
    assert [len(m) for m in tight.members] == [3, 1]
    scored_apart = [dataclasses.replace(samples[1], temperature=0.7), samples[3]]
    assert len(share_prefixes(pack_prefixes(scored_apart), scored_apart, 2048).members) == 2


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_shared_prefix_gives_every_logprob_and_gradient_of_the_rows_alone(tiny_model_dir, attention):
    """Logprobs, entropies and every parameter's gradient of a weighted sum of them equal those of
    the rows scored alone, on the Llama under both attentions that take the block mask."""
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=attention
    )
    results = [_scored(model, shared, attention == "eager") for shared in (False, True)]
    _same(*results)


def test_a_shared_prefix_is_exact_on_qwen3(qwen3_model_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen3_model_dir, dtype=torch.float32)
    _same(*(_scored(model, shared, False) for shared in (False, True)))


def test_a_merged_row_beside_a_row_alone_gives_the_logprobs_and_gradients_of_the_rows_alone(tiny_model_dir):
    """A step's rows need not all share: one merged row and one alone, under the block mask (three
    issue-53 runs failed a step in three on it: zip of a lone row's no blocks)."""
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    layout = share_prefixes(pack_prefixes(mixed_turns()), mixed_turns(), 2048)
    assert sorted(len(m) for m in layout.members) == [1, 4] and [] in layout.starts
    _same(*(_scored(model, shared, False, mixed_turns) for shared in (False, True)))


def _scored(model, shared: bool, additive: bool, turns=openclaw_turns):
    samples = turns()
    layout = pack_prefixes(samples)
    if shared:
        layout = share_prefixes(layout, samples, 2048)
    lengths = [len(s.response_ids) for s in samples]
    width = max(lengths)
    batch = left_pad(layout.prompts, layout.responses, torch.device("cpu"))
    batch.scored = loss_positions(layout, lengths, batch.targets.device)
    block_attention(batch, layout, additive)
    assert (batch.blocks is not None) == shared
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    model.zero_grad()
    logp, entropy = score(model, batch, torch.full((len(layout.members),), 0.9), entropy_grad=True)
    logp, entropy = unpack(logp, layout, width) * mask, unpack(entropy, layout, width) * mask
    ((logp * torch.linspace(1, 2, width)).sum() + 0.1 * entropy.sum()).backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _same(alone, shared):
    (logp_a, ent_a, grads_a), (logp_s, ent_s, grads_s) = alone, shared
    assert torch.allclose(logp_a, logp_s, atol=1e-5) and torch.allclose(ent_a, ent_s, atol=1e-5)
    assert (logp_s.abs().sum(1) > 0).all()
    assert len(grads_a) > 10 and grads_a.keys() == grads_s.keys()
    for name, grad in grads_a.items():
        # float32 sums in another order: the tied 152k-row embedding of the Qwen3 once differed by
        # 2.1e-6 in one element of 9.7M (its largest 6.5), so the floor scales with the tensor
        floor = 1e-6 * max(1.0, grad.abs().max().item())
        assert torch.allclose(grad, grads_s[name], rtol=1e-4, atol=floor), name


@pytest.mark.parametrize(
    ("model_dir", "opd_topk"), [("tiny_model_dir", 0), ("tiny_model_dir", 8), ("qwen3_model_dir", 0)]
)
def test_a_shared_step_is_the_unshared_step_for_fewer_tokens(request, model_dir, opd_topk):
    """The policy, the reference (KL) and the teacher (opd, hinted prompts behind the same system
    prompt) with the prefix shared: the loss, every figure and every trained parameter's gradient
    match each row alone."""
    directory = request.getfixturevalue(model_dir)
    results = []
    for share in (True, False):
        torch.manual_seed(0)
        model, optimizer = _model(directory, lr=1e-2)
        samples = openclaw_turns()
        for k in (1, 3):  # the hint appended to the last message, as algo/teacher.py does
            hinted = samples[k].prompt_ids + [7, 8, 9]
            samples[k] = dataclasses.replace(samples[k], kind="opd", teacher_prompt_ids=hinted)
        trainer = Trainer(
            model,
            optimizer,
            TrainConfig(kl_coef=0.1, entropy_coef=0.01, share_prefixes=share, opd_topk=opd_topk),
        )
        assert len(trainer._micro_batches(samples)[0][1]) == 1
        metrics = trainer.step(samples)
        results.append((metrics, [p.grad.clone() for n, p in model.named_parameters() if "lora_" in n]))
    (shared, lora_shared), (alone, lora_alone) = results
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "is_weight_mean", "mismatch", "opd_topk_kl"):
        assert shared[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    assert (shared["opd_topk_kl"] > 0) == (opd_topk > 0)
    assert shared["tokens_scored"] == alone["tokens_scored"] - 2 * len(SYSTEM)
    # the gradients, within 1e-5 of each one's largest entry (Adam's first step would turn a 1e-9
    # difference of a near-zero entry into a visible one)
    assert len(lora_alone) > 4
    for a, b in zip(lora_shared, lora_alone, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
