"""The canary gate, in the trainer: every new version is measured before it is published.

Right after a step, on the weights the trainer already holds:

1. the canary of the new weights on the general set's `canary` half: the
   likelihood score of the reference answers and the accuracy of greedy
   answers (`measure.py`), against the base model's (computed once per
   trainer process: with LoRA the base is the adapter switched off, so it
   costs no extra memory);
2. the forward KL(base || new) on the newest `guard.kl_turns` real main turns
   of the store: the last `guard.kl_context` tokens of each prompt and the
   first `guard.kl_tokens` of its response. The cut keeps the check's cost
   bounded when an agent's prompts run to thousands of tokens; both models
   read the same cut context, and the positions next to the answer are where
   a changed policy shows.

`clawrl.guard.verdict.decide` turns the figures into `passed` or `held`; the
trainer publishes the version with its status and figures in one transaction
(`Store.publish_version`), and the server only ever serves versions that are
not held (its version watcher, `clawrl/engine/watcher.py`). The check runs in the trainer
process, at its niceness and thread count, so serving never waits for it;
`seconds` in the figures is the wall time it added to the version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from clawrl.config import GuardConfig
from clawrl.guard.general import Encoded, encode, is_right, load_items
from clawrl.guard.measure import canary_score, forward_kl, greedy_answers, reference_logprobs
from clawrl.guard.verdict import decide
from clawrl.store.db import Store


@dataclass
class Canary:
    """The check. In an FSDP trainer group (`share` and `synced` given) every rank runs it on the
    same inputs, each forward a collective: the turns for the KL are rank 0's (the one with the
    store), shared with `share`, and greedy answers run until every rank's are done (`synced`)."""

    store: Store | None  # None on the ranks of a group other than rank 0
    items: list[Encoded]
    cfg: GuardConfig
    budget: int  # padded tokens per forward pass (train.micro_batch_tokens)
    tokenizer: Any = None
    share: Callable[[Any], Any] | None = None  # rank 0's object on every rank (the group's broadcast)
    synced: bool = False
    _base: tuple[float, float] | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        store: Store | None,
        tokenizer: Any,
        cfg: GuardConfig,
        budget: int,
        share: Callable[[Any], Any] | None = None,
    ) -> Canary:
        items = encode(load_items("canary"), tokenizer)
        return cls(store, items, cfg, budget, tokenizer, share, synced=share is not None)

    def measure(self, model: Any) -> tuple[float, float]:
        """(likelihood score, accuracy) of `model` on the canary items."""
        score = canary_score(reference_logprobs(model, self.items, self.budget))
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        answers = greedy_answers(model, self.items, pad, tok.eos_token_id, self.budget, self.synced)
        texts = [tok.decode(a, skip_special_tokens=True) for a in answers]
        right = [is_right(text, item.key) for text, item in zip(texts, self.items, strict=True)]
        return score, sum(right) / len(right)

    def base(self, policy: Any) -> tuple[float, float]:
        """The base model's (score, accuracy), measured on first use, then kept: the base never changes."""
        if self._base is None:
            with policy.trainer.reference() as base:
                self._base = self.measure(base)
        return self._base

    def check(self, policy: Any) -> tuple[str, dict[str, Any]]:
        """(status, figures) of the weights `policy` holds now."""
        start = time.perf_counter()
        base, base_accuracy = self.base(policy)
        score, accuracy = self.measure(policy.model)
        turns = self.store.recent_token_ids(self.cfg.kl_turns) if self.cfg.kl_turns and self.store else []
        if self.share is not None:
            turns = self.share(turns)
        turns = [(p[-self.cfg.kl_context :], r[: self.cfg.kl_tokens]) for p, r in turns]
        kl, tokens = None, 0
        if turns:
            kl, tokens = forward_kl(lambda: nullcontext(policy.model), policy.trainer.reference, turns)
        c = self.cfg
        verdict = decide(
            base, score, kl, c.max_drop, c.max_kl, (base_accuracy, accuracy), c.max_accuracy_drop
        )
        return verdict.status, {
            "score": score,
            "base_score": base,
            "drop": verdict.drop,
            "accuracy": accuracy,
            "base_accuracy": base_accuracy,
            "accuracy_drop": verdict.accuracy_drop,
            "kl": kl,
            "kl_turns": len(turns),
            "kl_tokens": tokens,
            "items": len(self.items),
            "seconds": time.perf_counter() - start,
            "reason": verdict.reason,
        }
