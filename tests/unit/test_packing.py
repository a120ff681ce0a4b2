"""A session's turns scored in one sequence (clawrl/train/packing.py): the same step, fewer tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clawrl.config import TrainConfig
from clawrl.train.packing import pack_prefixes, unpack
from clawrl.train.trainer import Trainer
from clawrl.types import Sample
from tests.unit.test_trainer import _model

SYSTEM = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198]


def turn(prompt: list[int], response: list[int], i: int, **kw) -> Sample:
    gen = torch.Generator().manual_seed(i)
    logprobs = (-10.8 + 0.3 * torch.randn(len(response), generator=gen)).tolist()  # near the tiny model's
    fields = {"reward": 1.0 if i % 2 else -1.0} | kw
    return Sample(f"t{i}", "rl", prompt, response, logprobs, "v0", 1.0, id=i, **fields)


def session() -> list[Sample]:
    """Three turns of one conversation, each prompt the last one's prompt and answer and a new message,
    and a turn of another conversation; given out of order."""
    first = turn(SYSTEM + [1, 520, 11, 12], [30, 31, 32, 2], 0)
    second = turn(first.prompt_ids + first.response_ids + [1, 520, 13, 14, 15], [33, 34, 2], 1)
    third = turn(second.prompt_ids + second.response_ids + [1, 520, 16], [35, 36, 37, 38, 2], 2)
    other = turn(SYSTEM + [1, 520, 99], [40, 41, 2], 3)
    return [third, other, first, second]


def test_turns_that_continue_each_other_share_one_row():
    samples = session()
    layout = pack_prefixes(samples)
    assert len(layout.members) == 2
    third, other, first, second = samples
    row = layout.row_of[2]
    assert layout.row_of[0] == layout.row_of[3] == row != layout.row_of[1]
    assert layout.members[row] == [2, 3, 0]  # first, second, third: by prompt length
    assert layout.prompts[row] + layout.responses[row] == third.prompt_ids + third.response_ids
    for i, s in enumerate(samples):  # each answer sits at its offset in its row's response
        response = layout.responses[layout.row_of[i]]
        assert response[layout.offsets[i] : layout.offsets[i] + len(s.response_ids)] == s.response_ids
    assert layout.tokens == len(third.prompt_ids) + len(third.response_ids) + len(other.prompt_ids) + 3
    assert len(pack_prefixes(samples, enabled=False).members) == 4


@pytest.mark.parametrize(
    "change",
    [{"temperature": 0.7}, {"rope_scaled": True}, {"grammar": {"type": "json"}}],
    ids=["temperature", "rope", "grammar"],
)
def test_turns_scored_differently_are_not_packed(change):
    third, other, first, second = session()
    assert len(pack_prefixes([first, dataclasses.replace(second, **change)]).members) == 2


def test_a_prompt_that_departs_from_the_history_is_its_own_row():
    third, other, first, second = session()
    edited = dataclasses.replace(second, prompt_ids=second.prompt_ids[:5] + [7] + second.prompt_ids[6:])
    assert len(pack_prefixes([first, edited]).members) == 2


def test_unpack_reads_each_samples_tokens_from_its_row():
    samples = session()
    layout = pack_prefixes(samples)
    rows = torch.zeros(len(layout.members), max(len(r) for r in layout.responses))
    for r, response in enumerate(layout.responses):
        rows[r, : len(response)] = torch.tensor(response, dtype=torch.float)
    out = unpack(rows, layout, 5)
    for i, s in enumerate(samples):
        assert out[i, : len(s.response_ids)].tolist() == s.response_ids


@pytest.mark.parametrize("opd_topk", [0, 8])  # the opd sample's gap, or its teacher's 8 likeliest
def test_a_packed_step_is_the_unpacked_step_for_fewer_tokens(tiny_model_dir, opd_topk):
    """The policy, the reference (KL) and the entropy read each answer from its session's one
    sequence: the loss, every figure and the update match scoring each turn alone (with the opd
    top-k term too: the teacher's tokens are scored where the packed row holds the answer)."""
    results = []
    for packed in (True, False):
        torch.manual_seed(0)
        model, optimizer = _model(tiny_model_dir, lr=1e-2)
        cfg = TrainConfig(kl_coef=0.1, entropy_coef=0.01, pack_prefixes=packed, opd_topk=opd_topk)
        samples = session()
        samples[3] = dataclasses.replace(
            samples[3], kind="opd", teacher_prompt_ids=samples[3].prompt_ids + [7, 8]
        )
        samples[0] = dataclasses.replace(samples[0], loss_mask=[1, 0, 1, 1, 1])
        metrics = Trainer(model, optimizer, cfg).step(samples)
        results.append((metrics, [p.detach().clone() for n, p in model.named_parameters() if "lora_" in n]))
    (packed, lora_packed), (alone, lora_alone) = results
    for key in (
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "grad_norm",
        "is_weight_mean",
        "mismatch",
        "mismatch_exact",
        "opd_topk_kl",
    ):
        assert packed[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    assert (packed["opd_topk_kl"] > 0) == (opd_topk > 0)
    assert packed["tokens"] == alone["tokens"] == 4 + 3 + 4 + 3
    third, other = session()[:2]
    one_row = len(third.prompt_ids) + len(third.response_ids)
    assert packed["tokens_scored"] == one_row + len(other.prompt_ids) + len(other.response_ids)
    assert alone["tokens_scored"] == sum(len(s.prompt_ids) + len(s.response_ids) for s in session())
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(lora_packed, lora_alone, strict=True))


def test_the_out_of_memory_retry_split_in_halves_and_unpacked_is_the_same_step(tiny_model_dir):
    """`Trainer.step(split=True)` (clawrl/train/failures.py): each micro-batch in halves, one sample
    a row; the loss, the figures and the update are the packed step's."""
    results = []
    for split in (False, True):
        torch.manual_seed(0)
        model, optimizer = _model(tiny_model_dir, lr=1e-2)
        trainer = Trainer(model, optimizer, TrainConfig(kl_coef=0.1))
        assert len(trainer._micro_batches(session(), split)[0][1]) == (2 if split else 1)
        metrics = trainer.step(session(), split=split)
        results.append((metrics, [p.detach().clone() for n, p in model.named_parameters() if "lora_" in n]))
    (whole, lora_whole), (halves, lora_halves) = results
    for key in ("loss", "pg_loss", "kl", "grad_norm", "is_weight_mean"):
        assert whole[key] == pytest.approx(halves[key], rel=1e-4, abs=1e-6), key
    assert halves["tokens_scored"] == sum(len(s.prompt_ids) + len(s.response_ids) for s in session())
    assert halves["tokens_scored"] > whole["tokens_scored"]  # unpacked
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(lora_whole, lora_halves, strict=True))


def test_the_lm_head_runs_at_the_answers_only_with_the_whole_logits_figures(tiny_model_dir):
    """A packed batch scored with logits at its answer tokens only (`Padded.scored`) gives the
    answers' logprobs and entropies, and every parameter's gradient, of logits kept over the whole
    response span (the messages between a session's answers included); the LM head's output has
    one row per answer token. Rows at different temperatures: each position keeps its row's."""
    from transformers import AutoModelForCausalLM

    from clawrl.train.batch import left_pad, score
    from clawrl.train.packing import loss_positions

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    samples = session()
    layout = pack_prefixes(samples)
    lengths = [len(s.response_ids) for s in samples]
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    temps = torch.tensor([0.7 if r == layout.row_of[1] else 1.3 for r in range(len(layout.members))])
    rows_seen: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, a, out: rows_seen.append(out.shape[1]))
    results = []
    for scored in (False, True):
        batch = left_pad(layout.prompts, layout.responses, torch.device("cpu"))
        batch.scored = loss_positions(layout, lengths, batch.targets.device) if scored else None
        model.zero_grad()
        logp, entropy = score(model, batch, temps, entropy_grad=True)
        logp, entropy = unpack(logp, layout, width) * mask, unpack(entropy, layout, width) * mask
        ((logp * torch.linspace(1, 2, width)).sum() + 0.1 * entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((logp.detach(), entropy.detach(), grads))
    hook.remove()
    (logp_all, ent_all, grads_all), (logp_ans, ent_ans, grads_ans) = results
    assert rows_seen == [max(len(r) for r in layout.responses) + 1, sum(lengths)]  # 12 + 1, then 15
    assert sum(lengths) < len(layout.members) * max(len(r) for r in layout.responses)  # fewer rows
    assert torch.allclose(logp_all, logp_ans, atol=1e-6) and torch.allclose(ent_all, ent_ans, atol=1e-6)
    assert (logp_ans[mask.bool()] < 0).all()
    assert len(grads_all) > 10 and grads_all.keys() == grads_ans.keys()
    for name, grad in grads_all.items():
        assert torch.allclose(grad, grads_ans[name], rtol=1e-4, atol=1e-7), name


def test_a_step_at_qwen3s_vocabulary_makes_the_logits_the_budget_counts(qwen3_model_dir):
    """A 3-turn session of ~600 tokens at Qwen3's 151,936-row vocabulary, packed into one row:
    each pass's LM head outputs one row per answer token (24), not per position from the first
    answer on (400+), and those logits with their gradient are the memory budget's arithmetic
    at 24 positions (clawrl/model/budget.py, bf16 as on a GPU)."""
    import json

    from clawrl.config import TrainConfig
    from clawrl.model.budget import Shape

    model, optimizer = _model(qwen3_model_dir, lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    seq: list[int] = []
    samples = []
    for k in range(3):
        seq += torch.randint(100, 150000, (200,), generator=gen).tolist()
        answer = torch.randint(100, 150000, (8,), generator=gen).tolist()
        samples.append(dataclasses.replace(turn(list(seq), answer, k), logprobs=[-11.9] * 8))
        seq += answer
    outputs: list[tuple[int, ...]] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, a, out: outputs.append(tuple(out.shape)))
    Trainer(model, optimizer, TrainConfig(kl_coef=0.1)).step(samples)
    hook.remove()
    assert outputs == [(1, 24, 151936)] * 2  # the reference (KL) and the policy, one row
    shape = Shape.from_config(json.loads((qwen3_model_dir / "config.json").read_text()))
    answers = sum(len(s.response_ids) for s in samples)
    # bf16 logits and their gradient, four 32 MiB float32 chunks
    assert shape.logits_bytes(answers) == 2 * (outputs[-1][1] * outputs[-1][2] * 2) + 4 * (32 << 20)
