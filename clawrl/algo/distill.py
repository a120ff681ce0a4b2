"""Memory distillation: a turn served with a memory block teaches the weights to do it unprompted.

Context distillation (OEL's experience-augmented teacher): the student is the policy reading the
client's messages alone, the teacher the same policy reading them with the memory block the
turn was served with (clawrl/memory). The sample is an `opd` one, so the trainer gives it

    A_t = w_opd * clip(logp(a_t | s + memory) - logp(a_t | s), -c, c)

per served response token a_t: `prompt_ids` are the bare prompt's, `teacher_prompt_ids` the
served prompt's (the turn's own `prompt_ids`, exactly as it was served), the response IDs and
the behaviour logprobs mu are the turn's, unaltered. mu was recorded under the longer prompt,
and the trainer takes the truncated importance weight w_t = min(exp(prox_t - mu_t), C) with
prox_t scored on `prompt_ids`, the bare prompt (train/importance.py): the correction for the
response having been drawn under the memory block is that weight, as for any off-policy token.

The sample carries the experiences of the block (`experience_ids`: traceable, and dropped when
one of them is erased) and no judgment: it needs no feedback, and a later judgment of the turn
neither supersedes it nor is blocked by it (clawrl/store/training.py). Its reward is 0, so rl's
at-least-one rule does not count it.
"""

from __future__ import annotations

from collections.abc import Callable

from clawrl.algo.base import eligible, make_sample
from clawrl.types import Sample, Turn

BarePrompt = Callable[[Turn], list[int]]
"""turn -> the prompt IDs of the client's messages alone, without the memory block."""


def memory_ids(turn: Turn) -> list[int]:
    """The experiences whose block the turn's prompt carried (none when the block was dropped)."""
    memory = turn.memory or {}
    return [int(i) for i in memory.get("ids") or []] if memory.get("block") else []


def distillation_sample(turn: Turn, bare_prompt_ids: list[int]) -> Sample | None:
    """The turn's memory distillation sample, or None: not an eligible turn, no block, or a bare prompt
    that renders the same as the served one (nothing to distil)."""
    ids = memory_ids(turn)
    if not ids or not eligible(turn) or bare_prompt_ids == turn.prompt_ids:
        return None
    sample = make_sample(turn, None, "opd", teacher_prompt_ids=list(turn.prompt_ids))
    sample.prompt_ids = list(bare_prompt_ids)
    sample.experience_ids = ids
    return sample
