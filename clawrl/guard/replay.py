"""`train.replay_fraction`: KL-anchored replay of the general set, against forgetting.

Each step also reads `n` items of the general set's `replay` half (prompt plus
reference answer; the canary never scores these), cycling through them, and
adds their forward KL to the base model, distillation from the base:

    L_replay = sum over replay tokens t of KL(pi_base(. | s_t) || pi_theta(. | s_t)) / N

where N is the step's own response-token count, so a replay token weighs as
much as a sample token in the step's token-level mean (train/loss.py) and
the samples' own terms are not diluted. With the step's share of replay
sequences `f = train.replay_fraction`, n = round(f / (1 - f) * batch_size), at
least 1. The KL is 0, with no gradient, while the policy is the base; it pulls
back only as the policy drifts on general prompts.
"""

from __future__ import annotations

from typing import Any

from clawrl.guard.general import Encoded, encode, load_items
from clawrl.guard.measure import device_of, reference_batches, response_log_softmax, token_kl, valid_positions


class Replay:
    def __init__(self, items: list[Encoded], fraction: float, batch_size: int, budget: int) -> None:
        if not items:
            raise ValueError("replay needs at least one general-set item")
        self.items = items
        self.per_step = max(1, round(fraction / (1 - fraction) * batch_size))
        self.budget = budget
        self._next = 0

    def take(self) -> list[Encoded]:
        """The next `per_step` items, cycling through the set."""
        out = [self.items[(self._next + i) % len(self.items)] for i in range(self.per_step)]
        self._next = (self._next + self.per_step) % len(self.items)
        return out

    def backward(self, trainer: Any, step_tokens: int) -> dict[str, float]:
        """Backpropagate L_replay for the next items into `trainer.model`; returns its metrics."""
        items = self.take()
        total, tokens = 0.0, 0
        for _, batch in reference_batches(items, self.budget, device_of(trainer.model)):
            with trainer.reference() as base:
                logp_base = response_log_softmax(base, batch)
            logp = response_log_softmax(trainer.model, batch)
            valid = valid_positions(batch, logp.shape[1])
            kl = token_kl(logp_base, logp)[valid].sum()
            (kl / step_tokens).backward()
            total, tokens = total + float(kl.detach()), tokens + int(valid.sum())
        return {"replay_kl": total / max(tokens, 1), "replay_items": len(items)}


def attach_replay(policy: Any, tokenizer: Any) -> None:
    """Give the policy's trainer a `Replay` when `train.replay_fraction` > 0."""
    cfg = policy.cfg
    if cfg.replay_fraction > 0:
        items = encode(load_items("replay"), tokenizer)
        policy.trainer.replay = Replay(items, cfg.replay_fraction, cfg.batch_size, cfg.micro_batch_tokens)
