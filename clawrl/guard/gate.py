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

3. the collapse figures (`collapse.py`) on the same canary prompts, from the
   greedy answers step 1 already made: the entropy along the version's own
   answers (read from the decoding steps) against the base's, the self-ROUGE-L
   between its answers to different prompts, and the drift of the logprob of
   the base's answers, which ride in the references' forward pass. A version
   past a limit is marked (`collapse.crossed`); with `guard.hold_on_collapse`
   it is held, the reason naming the figure.

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
from clawrl.guard import collapse
from clawrl.guard.general import Encoded, encode, is_right, load_items
from clawrl.guard.measure import (
    KL_BUDGET,
    answer_scores,
    as_answers,
    canary_score,
    forward_kl,
    greedy_answers,
)
from clawrl.guard.verdict import decide
from clawrl.store.db import Store


@dataclass(frozen=True)
class CanaryMeasures:
    """One model's figures on the canary items."""

    score: float  # canary_score of the references
    accuracy: float  # share of greedy answers that are right
    answers: list[Encoded]  # the greedy answers, as items (`as_answers`): the base's are the probes
    texts: list[str]  # the greedy answers, decoded
    self_rouge_l: float  # between the answers to different prompts (kept: the base's is measured once)
    entropy: float | None  # mean per-token entropy along the greedy answers
    probe_logprobs: list[float]  # mean logprob per token of each probe answer given to `measure`


@dataclass
class Canary:
    """The check. In an FSDP trainer group (`share` and `synced` given) every rank runs it on the
    same inputs, each forward a collective: the turns for the KL are rank 0's (the one with the
    store), shared with `share`, and greedy answers run until every rank's are done (`synced`)."""

    store: Store | None  # None on the ranks of a group other than rank 0
    items: list[Encoded]
    cfg: GuardConfig
    budget: int  # padded tokens per forward pass (train.micro_batch_tokens, at least KL_BUDGET)
    tokenizer: Any = None
    share: Callable[[Any], Any] | None = None  # rank 0's object on every rank (the group's broadcast)
    synced: bool = False
    _base: CanaryMeasures | None = field(default=None, repr=False)

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
        # Never fewer padded tokens per pass than the KL pass takes anyway: a trainer configured
        # with tiny micro-batches (a test's 48 tokens) would otherwise decode the canary's answers a
        # few rows at a time, 16 generate calls where one does (9 s instead of 1 on a tiny model).
        budget = max(budget, KL_BUDGET)
        return cls(
            store=store,
            items=items,
            cfg=cfg,
            budget=budget,
            tokenizer=tokenizer,
            share=share,
            synced=share is not None,
        )

    def measure(self, model: Any, probes: list[Encoded] | None = None) -> CanaryMeasures:
        """`model`'s figures on the canary items; `probes` (the base's answers) scored too, or,
        without them, its own answers are its probes (the base's case, once per process)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        greedy, entropies = greedy_answers(
            model=model,
            items=self.items,
            pad_id=pad,
            eos_id=tok.eos_token_id,
            budget=self.budget,
            synced=self.synced,
        )
        if self.share is not None:  # every rank packs the same answers into the same collective passes
            greedy, entropies = self.share((greedy, entropies))
        texts = [tok.decode(a, skip_special_tokens=True) for a in greedy]
        right = [is_right(text, item.key) for text, item in zip(texts, self.items, strict=True)]
        answers = as_answers(self.items, greedy, tok.eos_token_id)
        probes = answers if probes is None else probes
        # one packed pass: the references (the canary score) and the probes (drift)
        logps, _ = answer_scores(model, [*self.items, *probes], self.budget, with_entropy=False)
        n, entropy = len(self.items), collapse.mean_entropy(entropies)
        rouge = collapse.self_rouge_l(texts)
        return CanaryMeasures(
            score=canary_score(logps[:n]),
            accuracy=sum(right) / len(right),
            answers=answers,
            texts=texts,
            self_rouge_l=rouge,
            entropy=entropy,
            probe_logprobs=logps[n:],
        )

    def base(self, policy: Any) -> CanaryMeasures:
        """The base model's figures, measured on first use, then kept: the base never changes.
        Its probes are its own answers."""
        if self._base is None:
            with policy.trainer.reference() as base:
                self._base = self.measure(base)
        return self._base

    def check(self, policy: Any) -> tuple[str, dict[str, Any]]:
        """(status, figures) of the weights `policy` holds now."""
        start = time.perf_counter()
        base = self.base(policy)
        new = self.measure(policy.model, base.answers)
        # KL on the real prompts of the user whose adapter this is (an adapter per user), else everyone's.
        user = getattr(policy, "user", None)
        turns = (
            self.store.recent_token_ids(self.cfg.kl_turns, user) if self.cfg.kl_turns and self.store else []
        )
        if self.share is not None:
            turns = self.share(turns)
        turns = [(p[-self.cfg.kl_context :], r[: self.cfg.kl_tokens]) for p, r in turns]
        kl, tokens = None, 0
        if turns:
            kl, tokens = forward_kl(lambda: nullcontext(policy.model), policy.trainer.reference, turns)
        c = self.cfg
        accuracy = (base.accuracy, new.accuracy)
        verdict = decide(
            base=base.score,
            score=new.score,
            kl=kl,
            max_drop=c.max_drop,
            max_kl=c.max_kl,
            accuracy=accuracy,
            max_accuracy_drop=c.max_accuracy_drop,
        )
        watched = self.watch(base, new)
        status, reason = collapse.hold(verdict.status, verdict.reason, watched, c.hold_on_collapse)
        return status, {
            "score": new.score,
            "base_score": base.score,
            "drop": verdict.drop,
            "accuracy": new.accuracy,
            "base_accuracy": base.accuracy,
            "accuracy_drop": verdict.accuracy_drop,
            "kl": kl,
            "kl_turns": len(turns),
            "kl_tokens": tokens,
            "items": len(self.items),
            "collapse": watched.figures(),
            "seconds": time.perf_counter() - start,
            "reason": reason,
        }

    def watch(self, base: CanaryMeasures, new: CanaryMeasures) -> collapse.Collapse:
        """The collapse figures of `new` against the base, judged by the guard's limits."""
        c = self.cfg
        limits = collapse.Limits(
            min_entropy_ratio=c.collapse_min_entropy_ratio,
            max_self_rouge_l=c.collapse_max_self_rouge_l,
            max_drift=c.collapse_max_drift,
            max_entropy_ratio=c.collapse_max_entropy_ratio,
        )
        rouge, base_rouge = new.self_rouge_l, base.self_rouge_l
        drifted = collapse.drift(new.probe_logprobs, base.probe_logprobs)
        return collapse.judge(
            entropy=new.entropy,
            base_entropy=base.entropy,
            rouge=rouge,
            base_rouge=base_rouge,
            drifted=drifted,
            limits=limits,
        )
