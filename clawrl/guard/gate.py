"""The canary gate, in the trainer: every new version is measured before it is published.

Right after a step, on the weights the trainer already holds:

1. the canary score of the new weights on the general set's `canary` half,
   against the base model's (computed once per trainer process: with LoRA the
   base is the adapter switched off, so it costs no extra memory);
2. the forward KL(base || new) on the newest `guard.kl_turns` real main turns
   of the store: the last `guard.kl_context` tokens of each prompt and the
   first `guard.kl_tokens` of its response. The cut keeps the check's cost
   bounded when an agent's prompts run to thousands of tokens; both models
   read the same cut context, and the positions next to the answer are where
   a changed policy shows.

`clawrl.guard.verdict.decide` turns the figures into `passed` or `held`; the
trainer publishes the version with its status and figures in one transaction
(`Store.publish_version`), and the server only ever serves versions that are
not held (`Store.latest_servable_version`). The check runs in the trainer
process, at its niceness and thread count, so serving never waits for it;
`seconds` in the figures is the wall time it added to the version.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from clawrl.config import GuardConfig
from clawrl.guard.general import Encoded, encode, load_items
from clawrl.guard.measure import canary_score, forward_kl, reference_logprobs
from clawrl.guard.verdict import decide
from clawrl.store.db import Store


@dataclass
class Canary:
    store: Store
    items: list[Encoded]
    cfg: GuardConfig
    budget: int  # padded tokens per forward pass (train.micro_batch_tokens)
    _base: list[float] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, store: Store, tokenizer: Any, cfg: GuardConfig, budget: int) -> Canary:
        return cls(store, encode(load_items("canary"), tokenizer), cfg, budget)

    def base_logprobs(self, policy: Any) -> list[float]:
        """The base model's reference logprobs (measured on first use, then kept: the base never changes)."""
        if self._base is None:
            with policy.trainer.reference() as base:
                self._base = reference_logprobs(base, self.items, self.budget)
        return self._base

    def check(self, policy: Any) -> tuple[str, dict[str, Any]]:
        """(status, figures) of the weights `policy` holds now."""
        start = time.perf_counter()
        base = canary_score(self.base_logprobs(policy))
        score = canary_score(reference_logprobs(policy.model, self.items, self.budget))
        turns = self.store.recent_token_ids(self.cfg.kl_turns) if self.cfg.kl_turns else []
        turns = [(p[-self.cfg.kl_context :], r[: self.cfg.kl_tokens]) for p, r in turns]
        kl, tokens = None, 0
        if turns:
            kl, tokens = forward_kl(lambda: nullcontext(policy.model), policy.trainer.reference, turns)
        verdict = decide(base, score, kl, self.cfg.max_drop, self.cfg.max_kl)
        return verdict.status, {
            "score": score,
            "base_score": base,
            "drop": verdict.drop,
            "kl": kl,
            "kl_turns": len(turns),
            "kl_tokens": tokens,
            "items": len(self.items),
            "seconds": time.perf_counter() - start,
            "reason": verdict.reason,
        }
