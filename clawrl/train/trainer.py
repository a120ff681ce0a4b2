"""One training step: ready samples in, a new policy version out.

For each sample (prompt ids p, response ids a, behaviour logprobs logp_old):

    logp_t     = log softmax(policy(p + a) / T)[a_t]          with gradient
    ref_t      = the same with the LoRA adapter off             (only if kl_coef > 0)
    teacher_t  = the same under the hinted prompt (opd only)    by the live policy or the reference
    A_t        = w_rl * r                                                  (rl sample)
               = w_rl * r + w_opd * clip(teacher_t - logp_t, +-opd_clip)   (opd sample; logp_t detached)
    loss       = PPO clipped surrogate + kl_coef * KL_k3 - entropy_coef * H   (see train/loss.py)

The OPD gap's student term is the trainer's own logp_t (before this step's update), not the
behaviour logprob: see train/advantages.py. The behaviour logprob mu (what the sampler drew
from, on any engine and under any sampler) enters through the truncated importance weight
w_t = min(exp(logp_t - mu_t), C) only; the ratio is taken against the proximal policy, the
trainer's own logp_t before the step (decoupled PPO: train/importance.py). No turn is trained
on-policy by assumption.

Per step, besides the loss terms: `mismatch`, the mean |logp_t - mu_t| over the weighted
tokens, and the same by cause (`mismatch_exact`: same version, untruncated, unpenalised, same
prompt: numerics; `mismatch_stale`, `_processed`, `_conditioned`: train/importance.py), the
weights' `is_weight_mean`, `is_weight_min`, `is_truncated_frac` (and the samples with a
truncated token, or none recorded); `tokens_per_s` (answer tokens, what the loss trains) and
`processed_tokens_per_s` (the gradient pass's tokens, prompts included, as packed and shared);
the OPD gap's 5/50/95% quantiles and the share of opd tokens the clip cut (`opd_gap_*`); each
rank's peak memory so far, a list, rank 0 first (`peak_rss_mb`, and `peak_gpu_mb` on a GPU:
train/peaks.py). No clip or ratio figure: the ratio is to the step's own forward, so the clip
never acts within a step (train/loss.py).

Every mean is over all response tokens of the step (token-level): each
micro-batch's loss is its share of the step's mean (`num_tokens` = the step's
token count), so the gradient does not depend on how samples were packed.
Samples are packed into micro-batches of at most `train.micro_batch_tokens`
padded tokens (`train/batch.py`), so memory stays bounded for long samples.
Samples with an empty response, non-finite logprobs, a length mismatch or an
over-long sequence are skipped with a logged reason, which starts with its category
(`clawrl.types.SKIP_REASONS`, counted in /healthz, /metrics and the dashboard); samples more than
`max_staleness` training steps behind the version trained from, along its lineage (held versions
age nothing: train/lineage.py), are marked stale. Neither is ever trained on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from clawrl.config import TrainConfig
from clawrl.model.gpu import release_cached
from clawrl.model.heap import mapped_large_allocations, release_free_memory
from clawrl.train.advantages import GapStats, batch_advantages
from clawrl.train.batch import even_out, halves, left_pad, pack, pad_rows, score, score_with
from clawrl.train.group import RankGroup, split_by_tokens
from clawrl.train.importance import WeightSums, mismatch_cause, truncated_weights
from clawrl.train.lineage import steps_behind
from clawrl.train.loss import policy_loss
from clawrl.train.master import MasterWeights
from clawrl.train.packing import Layout, loss_positions, pack_prefixes, to_targets, unpack
from clawrl.train.peaks import peak_memory
from clawrl.train.shards import grad_norm_value
from clawrl.train.sharing import MASKED_ATTENTION, attention_of, block_attention, one_a_row, share_prefixes
from clawrl.train.sizing import CPU_MICRO_BATCH_TOKENS
from clawrl.train.topk import topk_kl
from clawrl.types import Sample, Version

log = logging.getLogger(__name__)
# Each micro-batch's share of the mean. No clip_frac, dual_frac or ratio_mean: the ratio is to the
# step's own forward (the proximal policy), so they are 0, 0 and 1 in every step (train/loss.py).
_SUMMED = ("pg_loss", "kl", "entropy", "opd_topk_kl")
_COUNTED = ("tokens_scored",)  # summed over micro-batches and ranks as they are
# A micro-batch's teacher: the sampled tokens' logprobs, and its K likeliest tokens' ids and logprobs.
_Optional = torch.Tensor | None
_TeacherOut = tuple[_Optional, _Optional, _Optional]


@dataclass
class Triage:
    """Which ready samples a step trains on, and why the others are left out."""

    usable: list[Sample] = field(default_factory=list)
    stale: list[tuple[Sample, str]] = field(default_factory=list)  # (sample, how far behind)
    skipped: list[tuple[Sample, str]] = field(default_factory=list)  # (sample, its defect)


def triage(
    samples: list[Sample],
    current: str,
    cfg: TrainConfig,
    vocab_size: int | None = None,
    lineage: Mapping[str, Version] | None = None,
) -> Triage:
    """Sort ready samples into usable, stale and skipped (with reasons); `vocab_size` bounds token
    ids, `cfg.max_seq_len` lengths (the policy's config has the served window; None: no bound).
    A sample's age is the training steps between its version and `current` along `lineage` (every
    version by name: train/lineage.py; held versions age nothing), by version number without it."""
    out = Triage()
    for s in samples:
        reason = _defect(s, cfg.max_seq_len, vocab_size)
        behind = steps_behind(lineage or {}, s.version, current)
        if reason is not None:
            out.skipped.append((s, reason))
        elif behind > cfg.max_staleness:
            out.stale.append((s, f"made by {s.version}, {behind} training steps behind {current}"))
        else:
            out.usable.append(s)
    return out


def _defect(s: Sample, max_len: int | None, vocab_size: int | None) -> str | None:
    if not s.response_ids:
        return "empty response: no token to train"
    if s.logprobs and len(s.logprobs) != len(s.response_ids):  # none (an old store): weight 1
        return f"bad logprobs: {len(s.logprobs)} logprobs for {len(s.response_ids)} tokens"
    if not all(math.isfinite(x) for x in s.logprobs):
        return "bad logprobs: non-finite behaviour logprobs"
    longest = _length(s)
    if max_len is not None and longest > max_len:
        return f"too long: {longest} tokens > the training window {max_len} (train.max_seq_len)"
    if s.kind == "opd" and not s.teacher_prompt_ids:
        return "no teacher prompt: an opd sample without one"
    if vocab_size is not None:  # an id the model has no embedding for would crash every step
        ids = [*s.prompt_ids, *s.response_ids, *(s.teacher_prompt_ids or [])]
        if min(ids) < 0 or max(ids) >= vocab_size:
            return f"unknown tokens: ids outside the model's vocabulary of {vocab_size}"
    return None


class Trainer:
    """Owns the policy model and its optimizer; `step` trains on a list of usable samples.

    `model` is a `peft.PeftModel` (the reference is the same model with the
    adapter off) or, for full fine-tuning, a plain model with `reference` a
    frozen copy of the base (None when neither KL nor a reference teacher needs it).
    Under a group of ranks (`train/group.py`) every rank calls `step` with the
    same samples and trains its share; the gradient pass runs through the
    group's (DDP) wrapper, the passes without gradient through the model itself.
    """

    def __init__(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        reference: torch.nn.Module | None = None,
        group: RankGroup | None = None,
        master: MasterWeights | None = None,
    ) -> None:
        self.model = model
        self.master = master  # bf16 weights, AdamW on their float32 masters (train/master.py)
        self.optimizer = optimizer
        self.cfg = cfg
        self.frozen = reference
        self.group = group or RankGroup()
        self.wrapped = self.group.prepare(model)
        self.device = next(model.parameters()).device
        # Float32 (master) weights on a GPU: forwards autocast to bf16 (`_autocast`).
        self._bf16 = self.device.type == "cuda" and next(model.parameters()).dtype == torch.float32
        self.replay: Any = None  # clawrl.guard.replay.Replay when train.replay_fraction > 0
        self._current: str | None = None  # the version the step in progress trains from
        attention = attention_of(model)  # a shared prefix's block mask needs one that takes 4D masks
        self._share = cfg.share_prefixes and attention in MASKED_ATTENTION
        self._additive = attention == "eager"

    @contextmanager
    def _scorer(self, reference: bool) -> Iterator[torch.nn.Module]:
        """The module that computes pi_ref (reference=True) or the live policy, without gradient."""
        with torch.no_grad(), self._autocast():
            if not reference:
                yield self.model
            elif hasattr(self.model, "disable_adapter"):
                with self.model.disable_adapter():
                    yield self.model
            elif self.frozen is not None:
                yield self.frozen
            else:
                raise ValueError("full fine-tuning needs a frozen reference for KL or a reference teacher")

    def reference(self) -> AbstractContextManager[torch.nn.Module]:
        """The reference model pi_ref (the base), without gradient: for the canary and replay."""
        return self._scorer(reference=True)

    def step(self, samples: list[Sample], split: bool = False, current: str | None = None) -> dict[str, Any]:
        """One optimizer step over `samples` (this rank's share of them), in micro-batches; the metrics.

        `split`: the retry of a step that ran out of memory (clawrl/train/failures.py): each
        micro-batch split in halves and no session packing (train/packing.py), the same samples
        and update at about half the activations a pass. `current`: the version trained from, which
        tells the mismatch's `stale` tokens from its `exact` ones (train/importance.py)."""
        start = time.perf_counter()
        self._current = current
        group = self.group
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)  # with masters: none left by a failed step
        total = sum(_tokens(s) for s in samples)  # the step's tokens, on every rank: the mean's denominator
        plans = self._micro_batches(samples, split)  # every rank's, so a lockstep group can match them
        mine, groups = plans[group.rank]
        lengths = [_length(s) for s in mine]
        passes = self._passes(plans)
        sums: Counter[str] = Counter({k: 0.0 for k in (*_SUMMED, *_COUNTED)})
        weights = WeightSums()
        gaps = GapStats(self.cfg.opd_clip)
        long = self.device.type == "cpu" and max(lengths, default=0) > self.cfg.long_sample_tokens
        with mapped_large_allocations(long):
            for k, teacher in enumerate(passes):
                real = k < len(groups)  # else a lockstep rank's zero-weight pass (`_passes`)
                micro = [mine[i] for i in groups[k if real else -1]]
                # The gradients are reduced in the backward of the last micro-batch only.
                with group.no_sync(self.wrapped, skip=k < len(passes) - 1):
                    terms, drift, scored = self._micro_loss(
                        micro, total, gaps if real else None, teacher, packed=not split
                    )
                    group.backward(terms.loss * (group.grad_scale if real else 0.0))
                if real:
                    for key in _SUMMED:
                        sums[key] += float(getattr(terms, key))
                    sums["tokens_scored"] += scored
                    weights.add(drift)
                del terms
        replayed = self.replay.backward(self, total) if self.replay is not None else {}
        if self.master is not None:
            self.master.to_masters()
        trained = self.optimizer.param_groups[0]["params"]  # the masters, or the trained weights
        grad_norm = torch.nn.utils.clip_grad_norm_(trained, self.cfg.grad_clip)
        self.optimizer.step()
        if self.master is not None:
            self.master.to_model()
        self.model.eval()
        release_free_memory()  # the step's freed activations go back to the OS, not kept until the next
        release_cached(self.device)  # and on a GPU to the driver, for the server beside it
        summed = group.sum(dict(sums))
        weights = weights.reduced(group.sum, group.min)  # over the ranks
        took = time.perf_counter() - start
        metrics = self._metrics(
            samples=samples, sums=summed, total=total, grad_norm=grad_norm_value(grad_norm), took=took
        )
        peaks = {key: group.gather(mb) for key, mb in peak_memory(self.device).items()}  # per rank
        return metrics | weights.metrics() | gaps.metrics() | replayed | peaks

    def _micro_batches(
        self, samples: list[Sample], split: bool = False
    ) -> list[tuple[list[Sample], list[list[int]]]]:
        """Per rank: (its share of `samples`, its micro-batches as indices into that share).

        The units are the rows of `pack_prefixes` (a session's turns that continue each other go
        together), each as long as its longest pass: the row, or an opd sample's teacher pass.
        `split`: one sample a row, and each micro-batch in halves (`step`)."""
        budget = self.cfg.micro_batch_tokens or CPU_MICRO_BATCH_TOKENS
        layout = self._shared(pack_prefixes(samples, self.cfg.pack_prefixes and not split), samples, split)
        rows = [[samples[i] for i in members] for members in layout.members]
        blocks = layout.starts or [[] for _ in rows]  # a shared prefix's rows have blocks
        lengths = [
            _row_length(p, r, row, bool(starts))
            for p, r, row, starts in zip(layout.prompts, layout.responses, rows, blocks, strict=True)
        ]
        shares = split_by_tokens(lengths, self.group.world)
        plans = [pack([lengths[r] for r in share], budget) for share in shares]
        if split:
            plans = [halves(p) for p in plans]
        if self.group.lockstep:  # as many passes on every rank, each its own samples where it can
            plans = [even_out(p, max(len(q) for q in plans)) for p in plans]
        out = []
        for share, groups in zip(shares, plans, strict=True):
            mine = [s for r in share for s in rows[r]]
            starts = [0]
            for r in share:
                starts.append(starts[-1] + len(rows[r]))
            out.append(
                (mine, [[i for g in group for i in range(starts[g], starts[g + 1])] for group in groups])
            )
        return out

    def _passes(self, plans: list[tuple[list[Sample], list[list[int]]]]) -> list[bool]:
        """This rank's micro-batch passes, each with whether it scores a teacher pass.

        Alone or under DDP: one per micro-batch, a teacher pass where it has opd samples. In a
        lockstep group (FSDP: every forward is a collective) every rank makes as many passes as
        the rank with the most (`even_out` splits a rank's micro-batches to match, where it has
        rows enough), and a teacher pass wherever any rank's pass has opd samples; a rank with
        fewer rows than passes passes its last one again, at zero weight."""
        mine, groups = plans[self.group.rank]
        if not self.group.lockstep:
            return [any(mine[i].kind == "opd" for i in g) for g in groups]
        count = max(len(g) for _, g in plans)
        return [
            any(s[i].kind == "opd" for s, g in plans for i in g[min(k, len(g) - 1)]) for k in range(count)
        ]

    def _metrics(
        self, samples: list[Sample], sums: dict[str, float], total: int, grad_norm: float, took: float
    ) -> dict[str, Any]:
        metrics: dict[str, Any] = {k: sums.get(k, 0.0) for k in _SUMMED}
        kinds = Counter(s.kind for s in samples)
        rl = [s.reward for s in samples if s.kind == "rl"]
        return metrics | {
            "loss": metrics["pg_loss"]
            + self.cfg.kl_coef * metrics["kl"]
            + self.cfg.w_opd * metrics["opd_topk_kl"]
            - self.cfg.entropy_coef * metrics["entropy"],
            "grad_norm": grad_norm,
            "mean_reward": sum(rl) / len(rl) if rl else None,
            "samples": len(samples),
            "samples_rl": kinds["rl"],
            "samples_opd": kinds["opd"],
            "samples_memory": sum(1 for s in samples if s.experience_ids),  # memory distillation's (opd)
            "tokens": total,
            "tokens_scored": int(sums.get("tokens_scored", 0)),  # one pass's tokens over the rows (packed)
            "step_s": took,
            "tokens_per_s": total / took,  # answer tokens: what the loss trains
            "processed_tokens_per_s": sums.get("tokens_scored", 0) / took,  # what the gradient pass runs
        }

    def _micro_loss(
        self, group: list[Sample], total: int, gaps: GapStats | None, teacher: bool, packed: bool = True
    ):
        """The loss of one micro-batch, as its share of the step's token-level mean, and its
        importance weights' sums (train/importance.py). `teacher`: score a teacher
        pass (a lockstep rank without opd rows scores one and drops it); `gaps`: None for a
        zero-weight pass, whose gaps are not counted; `packed`: False, one sample a row.

        The passes without gradient (teacher, reference) run first, so their logits are gone
        before the gradient pass builds its graph: the peak is one of them, not their sum.
        """
        cfg, device = self.cfg, self.device
        temps = torch.tensor([s.temperature for s in group], device=device)
        layout = pack_prefixes(group, cfg.pack_prefixes and packed)  # a session's turns in one row
        layout = self._shared(layout, group, not packed)  # rows sharing a prompt prefix run it once
        batch = left_pad(layout.prompts, layout.responses, device)
        first = [group[m[0]] for m in layout.members]
        batch.rope = [s.rope_scaled for s in first]  # as each was served (clawrl/model/rope.py)
        batch.grammar = [s.grammar for s in first]  # scored under the mask it was decoded under (alone)
        # the LM head runs at the answers only, not at the messages between a session's answers
        batch.scored = loss_positions(layout, [len(s.response_ids) for s in group], device)
        block_attention(batch, layout, self._additive)
        row_temps = torch.tensor([s.temperature for s in first], device=device)
        width = max(len(s.response_ids) for s in group)
        behaviour = pad_rows([s.logprobs for s in group], width, device)  # mu; [] for none recorded
        mask = pad_rows([s.loss_mask or [1] * len(s.response_ids) for s in group], width, device)
        teachers, top_ids, top_logp = self._teacher(group, temps, width) if teacher else (None, None, None)
        if top_ids is not None:  # the policy scores the teacher's likeliest tokens too (train/topk.py)
            lengths = [len(s.response_ids) for s in group]
            batch.extra = to_targets(top_ids, layout, lengths, batch.targets.shape[1])
        ref = None
        if cfg.kl_coef:
            with self._scorer(reference=True) as module:
                ref = unpack(score(module, batch, row_temps, with_entropy=False)[0], layout, width)
        # The entropy is reported; it carries a gradient only when it is trained (entropy_coef > 0).
        with self._autocast():
            scores = score_with(self.wrapped, batch, row_temps, entropy_grad=cfg.entropy_coef > 0)
        logp, entropy = unpack(scores.logp, layout, width), unpack(scores.entropy, layout, width)
        student = logp.detach()
        adv = batch_advantages(
            samples=group,
            student=student,
            teacher=teachers,
            w_rl=cfg.w_rl,
            w_opd=cfg.w_opd,
            opd_clip=cfg.opd_clip,
            stats=gaps,
            opd_centre=cfg.opd_centre,
            with_gap=top_ids is None,
        )
        recorded = torch.tensor([bool(s.logprobs) for s in group], device=device)
        causes = torch.tensor([mismatch_cause(s, self._current) for s in group], device=device)
        weights, sums = truncated_weights(
            prox=student, behaviour=behaviour, mask=mask, recorded=recorded, cap=cfg.is_cap, causes=causes
        )
        # old_logp is the proximal policy: the ratio is 1 at the step's start, its gradient is logp's.
        terms = policy_loss(
            logp=logp,
            old_logp=student,
            advantages=adv,
            mask=mask,
            ref_logp=ref,
            entropy=entropy,
            eps=cfg.eps,
            eps_high=cfg.eps_high,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            num_tokens=total,
            dual_clip=cfg.dual_clip,
            kl_clamp=cfg.kl_clamp,
            is_weight=weights,
        )
        if top_logp is not None and scores.extra_logp is not None:
            opd = torch.tensor([s.kind == "opd" for s in group], device=device)[:, None] & mask.bool()
            student_top = unpack(scores.extra_logp, layout, width)
            distill = topk_kl(student_top, top_logp, opd, total)
            terms.loss = terms.loss + cfg.w_opd * distill
            terms.opd_topk_kl = distill.detach()
        return terms, sums, layout.tokens

    def _shared(self, layout: Layout, samples: list[Sample], split: bool) -> Layout:
        """`layout` with its rows that share a prompt prefix merged (train/sharing.py), when on."""
        if not self._share or split:
            return layout
        return share_prefixes(layout, samples, self.cfg.micro_batch_tokens or CPU_MICRO_BATCH_TOKENS)

    def _autocast(self) -> AbstractContextManager[None]:
        """bf16 autocast around the gradient pass of float32 (master) weights on a GPU; else none."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self._bf16 else nullcontext()

    def _teacher(self, group: list[Sample], temps: torch.Tensor, width: int) -> _TeacherOut:
        """Teacher logprobs [B, width] of the opd rows (under their hinted prompts), and with
        `train.opd_topk` K its K likeliest tokens there and their logprobs ([B, width, K] each,
        train/topk.py; else None); all None without opd."""
        rows = [i for i, s in enumerate(group) if s.kind == "opd"]
        if not rows:  # a lockstep rank joins another rank's teacher pass: its first row, dropped
            batch = left_pad([group[0].prompt_ids], [group[0].response_ids], self.device)
            with self._scorer(reference=self.cfg.opd_teacher == "reference") as module:
                score(module, batch, temps[:1], with_entropy=False)
            return None, None, None
        opd = [group[i] for i in rows]
        layout = one_a_row([s.teacher_prompt_ids or [] for s in opd], [s.response_ids for s in opd])
        layout = self._shared(layout, opd, split=False)  # the hinted prompts share the system prompt
        batch = left_pad(layout.prompts, layout.responses, self.device)
        first = [opd[m[0]] for m in layout.members]
        batch.rope = [s.rope_scaled for s in first]
        batch.grammar = [s.grammar for s in first]
        if any(layout.starts):  # the LM head at the answers only, not at the blocks' prompt tails
            batch.scored = loss_positions(layout, [len(s.response_ids) for s in opd], self.device)
        block_attention(batch, layout, self._additive)
        with self._scorer(reference=self.cfg.opd_teacher == "reference") as module:
            row_temps = torch.tensor([s.temperature for s in first], device=self.device)
            scores = score_with(module, batch, row_temps, with_entropy=False, topk=self.cfg.opd_topk)
        out = torch.zeros(len(group), width, device=self.device)
        out[rows] = unpack(scores.logp, layout, width)
        if scores.top_ids is None or scores.top_logp is None:
            return out, None, None
        k = scores.top_ids.shape[-1]
        ids = torch.zeros(len(group), width, k, dtype=torch.long, device=self.device)
        top = torch.zeros(len(group), width, k, device=self.device)
        ids[rows], top[rows] = unpack(scores.top_ids, layout, width), unpack(scores.top_logp, layout, width)
        return out, ids, top


def _tokens(s: Sample) -> int:
    return sum(s.loss_mask) if s.loss_mask is not None else len(s.response_ids)


def _row_length(prompt: list[int], response: list[int], samples: list[Sample], shared: bool = False) -> int:
    """The longest sequence a row of `pack_prefixes` is scored as: itself, or an opd sample's teacher
    pass; a shared prefix's row (train/sharing.py): itself, or its opd samples' teacher blocks after
    the prefix (their hinted prompts share it)."""
    if shared:
        hinted = (
            len(s.teacher_prompt_ids or []) - len(prompt) + len(s.response_ids)
            for s in samples
            if s.kind == "opd"
        )
        return len(prompt) + max(len(response), sum(hinted))
    return max(len(prompt) + len(response), *(_length(s) for s in samples))


def _length(s: Sample) -> int:
    """The longest sequence the sample is scored as: its prompt or its hinted prompt, plus the response."""
    return max(len(s.prompt_ids), len(s.teacher_prompt_ids or [])) + len(s.response_ids)
