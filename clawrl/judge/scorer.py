"""The likelihood judge's calls: label scores through the server's own engine.

`LikelihoodJudge.read(reply, variant)` renders vote `variant`'s prompt (`judge/likelihood.py`),
asks the engine for the log-probability of each label word after it and after the
content-free prompt (one forward for all labels when each is one token, as " good" and " bad"
are for SmolLM2's and Qwen's tokenizers: `Engine.next_token_logprobs`), and returns the
`Reading`. With `base=True` (`judge.weights = "base"`, the default) every score runs on the
base model's weights whatever version is served: the judge stays frozen while the policy it
rewards moves. The content-free scores depend only on the variant (and, judging with the
policy, on the served version), so they are computed once and kept.

Raises `JudgeCallFailed` for an engine that cannot score now (stopped, failed, or a full
version served where the base is asked for); the judge loop retries and records a failed vote.
"""

from __future__ import annotations

from typing import Any

from clawrl.engine.base import Engine, EngineError
from clawrl.judge.backends import JudgeCallFailed
from clawrl.judge.likelihood import LABELS, Reading, content_free, cue_of, prompt, reading


class LikelihoodJudge:
    def __init__(self, engine: Engine, tokenizer: Any, base: bool = True) -> None:
        self.engine, self.tokenizer, self.base = engine, tokenizer, base
        self.name = f"likelihood:{'base' if base else 'policy'}"
        self._labels = {label: self._label_ids(word) for label, word in LABELS}
        self._content_free: dict[tuple[int, str, str], dict[int, float]] = {}

    async def read(self, reply: str, variant: int) -> Reading:
        scores = await self._scores(prompt(variant, reply))
        neutral = content_free(reply)
        key = (variant, neutral, "v0" if self.base else self.engine.version)
        if key not in self._content_free:
            self._content_free[key] = await self._scores(prompt(variant, neutral))
        return reading(variant, scores, self._content_free[key], cue_of(reply))

    async def _scores(self, text: str) -> dict[int, float]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        room = self.engine.max_context - 1
        if len(ids) > room:
            raise JudgeCallFailed(f"the judge prompt ({len(ids)} tokens) does not fit the context")
        try:
            if all(len(word) == 1 for word in self._labels.values()):  # one forward for all labels
                firsts = [word[0] for word in self._labels.values()]
                logprobs = await self.engine.next_token_logprobs(ids, firsts, base=self.base)
                return dict(zip(self._labels, logprobs, strict=True))
            return {
                label: sum(await self.engine.score(ids, word, base=self.base))
                for label, word in self._labels.items()
            }
        except (EngineError, ValueError) as exc:
            raise JudgeCallFailed(f"{type(exc).__name__}: {exc}") from exc

    def _label_ids(self, word: str) -> list[int]:
        """The label word's tokens (one for SmolLM2's and Qwen's tokenizers; a longer one is summed)."""
        return self.tokenizer.encode(word, add_special_tokens=False)
