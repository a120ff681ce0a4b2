"""The canary's measurements, on whatever weights the trainer holds (no gradient).

- `reference_logprobs`: for each general-set item, the mean log-probability
  per token of its reference answer (end-of-turn token included) under the
  model. The canary *score* of a model is the mean over items of
  `exp(mean logprob)`, the per-token geometric-mean probability of the
  references, a number in [0, 1] that falls smoothly as a model forgets,
  where exact-match on a few dozen items would move in steps of 3%.
- `greedy_answers`: each item's greedy answer (up to `ANSWER_TOKENS` tokens),
  with the mean entropy along it read from the decoding steps (`AnswerEntropy`);
  the canary's *accuracy* is the share whose answer contains the item's key
  (`general.is_right`). Unlike the likelihood, it does not rise when a
  version merely learns to answer in fewer words: a model trained to be brief
  gives the one-sentence references more probability without knowing more.
- `answer_scores`: the same per-token mean logprob of any answers (and the
  mean entropy of the model's distribution along them): the canary's drift
  (`collapse.py`) reads the base's greedy answers (`as_answers`) this way.
- `forward_kl`: the mean per-token forward KL(pi_base || pi_new), summed over
  the full vocabulary, at the response positions of real turns:

      KL_t = sum_v p_base(v | s_t) * (log p_base(v | s_t) - log p_new(v | s_t))

  RL's Razor (Shenfeld et al., 2025) found this forward KL, measured on the
  new task's inputs, predicts how much a fine-tuned model forgets. They
  average it over responses sampled from the base; we read it along the
  responses the server actually sent (recorded turns), which costs two
  forward passes instead of a generation, and are the contexts the model
  meets. Positions are exact (full-vocabulary), not sampled estimates.

Both pack their sequences under a padded-token budget, as training steps do
(`clawrl.train.batch`), so memory stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn
from transformers import LogitsProcessor, LogitsProcessorList

from clawrl.guard.general import Encoded
from clawrl.train.batch import Padded, left_pad, pack, response_logits, score

Scope = Callable[[], AbstractContextManager[nn.Module]]  # enters a model without gradient
ANSWER_TOKENS = 24  # a general-set answer's key comes in its first sentence
KL_BUDGET = 1024  # padded tokens per pass: [rows, R, vocab] logits twice, so smaller than training's


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def reference_batches(
    items: Sequence[Encoded], budget: int, device: torch.device
) -> Iterator[tuple[list[int], Padded]]:
    """(item indices, left-padded prompt + reference answer batch), packed under `budget` tokens."""
    for group in pack([len(i.prompt_ids) + len(i.reference_ids) for i in items], budget):
        rows = [items[i] for i in group]
        yield group, left_pad([r.prompt_ids for r in rows], [r.reference_ids for r in rows], device)


def reference_logprobs(model: nn.Module, items: Sequence[Encoded], budget: int) -> list[float]:
    """Mean log-probability per reference token of each item, in item order."""
    return answer_scores(model, items, budget, with_entropy=False)[0]


@torch.no_grad()
def answer_scores(
    model: nn.Module, items: Sequence[Encoded], budget: int, with_entropy: bool = True
) -> tuple[list[float], list[float]]:
    """(mean logprob, mean entropy) per token of each item's `reference_ids` as its answer, in item
    order; the entropies (nats, full vocabulary, temperature 1) are empty without `with_entropy`."""
    device = device_of(model)
    logps: list[float] = [0.0] * len(items)
    entropies: list[float] = [0.0] * len(items) if with_entropy else []
    for group, batch in reference_batches(items, budget, device):
        logp, entropy = score(model, batch, torch.ones(len(group), device=device), with_entropy)
        for row, i in enumerate(group):
            n = len(items[i].reference_ids)
            logps[i] = float(logp[row, :n].mean())
            if entropy is not None:
                entropies[i] = float(entropy[row, :n].mean())
    return logps, entropies


def as_answers(items: Sequence[Encoded], answers: Sequence[list[int]], eos_id: int | None) -> list[Encoded]:
    """`items` with greedy `answers` in place of their references, to be scored as answers are.

    An answer that ended (shorter than ANSWER_TOKENS) gets its end-of-turn token back, so an
    empty answer is still one token to score."""
    out = []
    for item, answer in zip(items, answers, strict=True):
        ended = eos_id is not None and len(answer) < ANSWER_TOKENS
        out.append(Encoded(item.id, item.prompt_ids, list(answer) + ([eos_id] if ended else []), item.key))
    return out


@torch.no_grad()
def greedy_answers(
    model: nn.Module,
    items: Sequence[Encoded],
    pad_id: int,
    eos_id: int | None,
    budget: int,
    synced: bool = False,
) -> tuple[list[list[int]], list[float]]:
    """(answers, entropies): each item's greedy answer tokens (at most ANSWER_TOKENS, up to the end of
    the turn), and the mean per-token entropy of the model's distribution along it (end-of-turn
    position included), in item order. The entropy is read from the decoding steps themselves
    (`AnswerEntropy`), so it costs no forward pass.

    `synced`: the model is sharded over a group of ranks (FSDP), each decoding step a collective:
    every rank steps until all are done, so a numeric difference cannot leave one waiting."""
    device = device_of(model)
    out: list[list[int]] = [[] for _ in items]
    entropies: list[float] = [0.0 for _ in items]
    for group in pack([len(i.prompt_ids) + ANSWER_TOKENS for i in items], budget):
        prompts = left_pad([items[i].prompt_ids for i in group], [[] for _ in group], device)
        width = prompts.input_ids.shape[1]
        meter = AnswerEntropy(width, eos_id)
        made = model.generate(
            input_ids=prompts.input_ids,
            attention_mask=prompts.attention_mask,
            max_new_tokens=ANSWER_TOKENS,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            synced_gpus=synced,
            logits_processor=LogitsProcessorList([meter]),
        )[:, width:]
        for row, (i, entropy) in enumerate(zip(group, meter.means(), strict=True)):
            tokens = made[row].tolist()
            out[i] = tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens
            entropies[i] = entropy
    return out, entropies


class AnswerEntropy(LogitsProcessor):
    """Leaves each decoding step's logits as they are, and adds up per row the entropy (nats, full
    vocabulary, temperature 1) of the step's distribution while the row's answer has not ended."""

    def __init__(self, width: int, eos_id: int | None) -> None:
        self.width, self.eos_id = width, eos_id
        self.total: Tensor | None = None  # [B] summed entropy
        self.steps: Tensor | None = None  # [B] steps counted

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        logp = torch.log_softmax(scores.float(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)  # [B]
        made = input_ids[:, self.width :]
        live = torch.ones_like(entropy) if self.eos_id is None else (made != self.eos_id).all(-1).float()
        self.total = entropy * live if self.total is None else self.total + entropy * live
        self.steps = live if self.steps is None else self.steps + live
        return scores

    def means(self) -> list[float]:
        if self.total is None or self.steps is None:
            return []
        return (self.total / self.steps.clamp(min=1)).tolist()


def canary_score(logprobs: Sequence[float]) -> float:
    """The mean over items of exp(mean logprob per token): in [0, 1], higher is better."""
    return sum(math.exp(x) for x in logprobs) / len(logprobs)


@torch.no_grad()
def forward_kl(
    new: Scope, base: Scope, turns: Sequence[tuple[list[int], list[int]]], budget: int = KL_BUDGET
) -> tuple[float, int]:
    """(mean per-token KL(base || new) in nats, tokens read) over the response positions of `turns`."""
    total, count = 0.0, 0
    for group in pack([len(p) + len(r) for p, r in turns], budget):
        with new() as model:
            batch = left_pad([turns[i][0] for i in group], [turns[i][1] for i in group], device_of(model))
            logp_new = response_log_softmax(model, batch)
        with base() as model:
            logp_base = response_log_softmax(model, batch)
        kl = token_kl(logp_base, logp_new)
        valid = valid_positions(batch, kl.shape[1])
        total += float(kl[valid].sum())
        count += int(valid.sum())
        del logp_new, logp_base, kl
    return (total / count if count else 0.0), count


def response_log_softmax(model: nn.Module, batch: Padded) -> Tensor:
    """log softmax [B, R_max, V] at the positions that predict each response token (right-aligned)."""
    return torch.log_softmax(response_logits(model, batch)[:, :-1].float(), dim=-1)


def token_kl(logp_base: Tensor, logp_new: Tensor) -> Tensor:
    """KL(base || new) at each position [B, R_max], summed over the vocabulary, from log-softmaxes."""
    return (logp_base.exp() * (logp_base - logp_new)).sum(-1)


def valid_positions(batch: Padded, r_max: int) -> Tensor:
    """[B, R_max] True where row i holds one of its R_i response positions (the last R_i)."""
    lengths = torch.tensor(batch.lengths, device=batch.input_ids.device)[:, None]
    return torch.arange(r_max, device=batch.input_ids.device)[None] >= r_max - lengths
