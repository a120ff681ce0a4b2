"""Scoring given tokens with the local engine's model: the trainer-free half of `Engine`.

`score` gives each response token's logprob under log_softmax(logits / T) after the prompt
(the canary, the judge's generation checks); `next_token` gives the logprobs of a few
candidate tokens at the position after the prompt, from one forward pass (the likelihood
judge's labels). Both run on the served weights or, with `base=True`, on the base ones: the
live model called with the base copies of the weights a version changed (none while v0 is
served), so judging on frozen weights costs no second model. The engine runs them in its
own thread, as background jobs (`clawrl/engine/local/schedule.py`).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from clawrl.engine.base import EngineFailed
from clawrl.engine.local.merge import VersionMerger
from clawrl.engine.local.sampling import score_tokens
from clawrl.version_folder import AdapterError


class Scorer:
    """Logprobs of given tokens under the engine's model (module docstring)."""

    def __init__(self, model: torch.nn.Module, versions: VersionMerger, device: torch.device) -> None:
        self.model = model
        self.versions = versions
        self.device = device

    @torch.inference_mode()
    def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float, base: bool
    ) -> list[float]:
        if not prompt_ids or not response_ids:
            raise ValueError("score needs a non-empty prompt and response")
        logits = self._logits(prompt_ids + response_ids, len(response_ids) + 1, base)[:-1]
        targets = torch.tensor(response_ids, device=self.device)
        return score_tokens(logits, targets, temperature).tolist()

    @torch.inference_mode()
    def next_token(self, prompt_ids: list[int], token_ids: list[int], base: bool) -> list[float]:
        if not prompt_ids or not token_ids:
            raise ValueError("next_token_logprobs needs a non-empty prompt and tokens")
        logprobs = torch.log_softmax(self._logits(prompt_ids, 1, base)[-1].float(), dim=-1)
        return logprobs[torch.tensor(token_ids, device=self.device)].tolist()

    def _logits(self, ids: list[int], keep: int, base: bool) -> torch.Tensor:
        """The last `keep` positions' logits [keep, V] of one sequence, on the served or base weights."""
        kwargs = {"input_ids": torch.tensor([ids], device=self.device), "logits_to_keep": keep}
        try:
            with self.versions.on_base(self.device) if base else nullcontext({}) as frozen:
                if frozen:
                    output = torch.func.functional_call(self.model, frozen, (), kwargs, strict=False)
                else:
                    output = self.model(**kwargs)
        except AdapterError as exc:  # a full version was served: the base weights are gone
            raise EngineFailed(f"cannot score on the base weights: {exc}") from exc
        return output.logits[0]
