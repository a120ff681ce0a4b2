"""One training step: ready samples in, a new policy version out.

For each sample (prompt ids p, response ids a, behaviour logprobs logp_old):

    logp_t     = log softmax(policy(p + a) / T)[a_t]          with gradient
    ref_t      = the same with the LoRA adapter off             (only if kl_coef > 0)
    teacher_t  = the same under the hinted prompt (opd only)    by the live policy or the reference
    A_t        = w_rl * r                       (rl sample)
               = w_opd * (teacher_t - logp_old_t) (opd sample)
    loss       = PPO clipped surrogate + kl_coef * KL_k3 - entropy_coef * H   (see train/loss.py)

Every mean is over all response tokens of the step (token-level), so each
sample's loss is weighted by its token count before its backward pass. Samples
are run one at a time (a micro-batch of one sequence): memory stays bounded by
the longest allowed sample (`train.max_seq_len`), which matters on a laptop.
Samples with an empty response, non-finite logprobs, a length mismatch or an
over-long sequence are skipped with a logged reason; samples more than
`max_staleness` versions behind are marked stale. Neither is ever trained on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from clawrl.config import TrainConfig
from clawrl.train.advantages import advantages
from clawrl.train.checkpoints import version_number
from clawrl.train.loss import policy_loss, token_logprobs
from clawrl.types import Sample

log = logging.getLogger(__name__)


@dataclass
class Triage:
    """Which ready samples a step trains on, and why the others are left out."""

    usable: list[Sample] = field(default_factory=list)
    stale: list[Sample] = field(default_factory=list)
    skipped: list[tuple[Sample, str]] = field(default_factory=list)


def triage(samples: list[Sample], current: str, cfg: TrainConfig) -> Triage:
    out = Triage()
    now = version_number(current)
    for s in samples:
        reason = _defect(s, cfg)
        if reason is not None:
            out.skipped.append((s, reason))
        elif now - version_number(s.version) > cfg.max_staleness:
            out.stale.append(s)
        else:
            out.usable.append(s)
    return out


def _defect(s: Sample, cfg: TrainConfig) -> str | None:
    if not s.response_ids:
        return "empty response"
    if len(s.logprobs) != len(s.response_ids):
        return f"{len(s.logprobs)} logprobs for {len(s.response_ids)} tokens"
    if not all(math.isfinite(x) for x in s.logprobs):
        return "non-finite behaviour logprobs"
    longest = max(len(s.prompt_ids), len(s.teacher_prompt_ids or [])) + len(s.response_ids)
    if longest > cfg.max_seq_len:
        return f"{longest} tokens > train.max_seq_len {cfg.max_seq_len}"
    if s.kind == "opd" and not s.teacher_prompt_ids:
        return "opd sample without a teacher prompt"
    return None


class Trainer:
    """Owns the PEFT model and its optimizer; `step` trains on a list of usable samples."""

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
        self.model = model  # a peft.PeftModel: the reference is the same model with the adapter off
        self.optimizer = optimizer
        self.cfg = cfg
        self.device = next(model.parameters()).device

    def _logprobs(
        self, prompt: list[int], response: list[int], temperature: float
    ) -> tuple[torch.Tensor, ...]:
        ids = torch.tensor([prompt + response], device=self.device)
        logits = self.model(input_ids=ids, logits_to_keep=len(response) + 1).logits[:, :-1]
        target = torch.tensor([response], device=self.device)
        return token_logprobs(logits, target, temperature)

    @torch.no_grad()
    def _frozen(
        self, prompt: list[int], response: list[int], temperature: float, reference: bool
    ) -> torch.Tensor:
        with self.model.disable_adapter() if reference else nullcontext():
            return self._logprobs(prompt, response, temperature)[0]

    def step(self, samples: list[Sample]) -> dict[str, Any]:
        """One optimizer step over `samples`; returns the step's metrics."""
        start = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = sum(sum(s.loss_mask) if s.loss_mask is not None else len(s.response_ids) for s in samples)
        sums: Counter[str] = Counter()
        for s in samples:
            terms = self._sample_loss(s)
            (terms.loss * (terms.tokens / total)).backward()
            for key in ("pg_loss", "kl", "entropy", "clip_frac"):
                sums[key] += float(getattr(terms, key)) * terms.tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], self.cfg.grad_clip
        )
        self.optimizer.step()
        self.model.eval()
        took = time.perf_counter() - start
        metrics: dict[str, Any] = {k: v / total for k, v in sums.items()}
        kinds = Counter(s.kind for s in samples)
        rl = [s.reward for s in samples if s.kind == "rl"]
        metrics |= {
            "loss": metrics["pg_loss"]
            + self.cfg.kl_coef * metrics["kl"]
            - self.cfg.entropy_coef * metrics["entropy"],
            "grad_norm": float(grad_norm),
            "mean_reward": sum(rl) / len(rl) if rl else None,
            "samples": len(samples),
            "samples_rl": kinds["rl"],
            "samples_opd": kinds["opd"],
            "tokens": total,
            "step_s": took,
            "tokens_per_s": total / took,
        }
        return metrics

    def _sample_loss(self, s: Sample):
        cfg = self.cfg
        logp, entropy = self._logprobs(s.prompt_ids, s.response_ids, s.temperature)
        if not cfg.entropy_coef:
            entropy = entropy.detach()  # reported, not trained: free its [T, V] graph
        old = torch.tensor([s.logprobs], device=self.device)
        teacher = None
        if s.kind == "opd":
            assert s.teacher_prompt_ids is not None
            teacher = self._frozen(
                s.teacher_prompt_ids, s.response_ids, s.temperature, reference=cfg.opd_teacher == "reference"
            )[0]
        adv = advantages(s.kind, s.reward, old[0], teacher, cfg.w_rl, cfg.w_opd)[None]
        ref = (
            self._frozen(s.prompt_ids, s.response_ids, s.temperature, reference=True) if cfg.kl_coef else None
        )
        mask = (
            torch.ones_like(old) if s.loss_mask is None else torch.tensor([s.loss_mask], device=self.device)
        )
        return policy_loss(
            logp,
            old,
            adv,
            mask,
            ref,
            entropy,
            eps=cfg.eps,
            eps_high=cfg.eps_high,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
        )
