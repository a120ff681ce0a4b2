"""Retired when learned: whether the bare policy already does what an experience asks (pure).

The retirement probe (clawrl/train/memory_probe.py) scores the policy's own answers to a few of
the owner's newest prompts twice: under the client's messages alone (the bare policy) and with a
memory block of one experience added (the memory-augmented policy). Per answer it takes the mean
per-token logprob gap, teacher minus student (the advantage memory distillation trains on,
clawrl/algo/distill.py):

    g_i = mean_t [ log pi(a_t | s_i + e) - log pi(a_t | s_i) ]        gap(e) = mean_i |g_i|

gap(e) near 0 means adding the experience no longer changes what the policy says: the weights
already do it, and the experience is `distilled` (no longer injected). Hysteresis keeps it from
flapping: `distilled` under `distilled_below`, `active` again over `active_above`, and between the
two the state stays. A `retired` experience (erased by its user) is never moved.

A limit to know: on prompts where the experience does not apply ("Answer in French" on a code
question that is already answered in code) the gap is small too; the probe reads the newest
prompts, so an experience that no recent prompt calls for can be marked distilled, and it is
`active` again once prompts that call for it show the gap.
"""

from __future__ import annotations

from collections.abc import Sequence

from clawrl.types import EXPERIENCE_ACTIVE, EXPERIENCE_DISTILLED, EXPERIENCE_RETIRED


def answer_gap(teacher: Sequence[float], student: Sequence[float]) -> float:
    """g_i: the mean per-token gap, teacher minus student, of one answer; ValueError when they differ
    in length or are empty."""
    if len(teacher) != len(student) or not teacher:
        counts = f"{len(teacher)} and {len(student)}"
        raise ValueError(f"an answer's gap needs as many teacher as student logprobs, not none: {counts}")
    return sum(t - s for t, s in zip(teacher, student, strict=True)) / len(teacher)


def experience_gap(answer_gaps: Sequence[float]) -> float | None:
    """gap(e): the mean |g_i| over the answers probed; None with none."""
    return sum(abs(g) for g in answer_gaps) / len(answer_gaps) if answer_gaps else None


def next_state(state: str, gap: float, distilled_below: float, active_above: float) -> str:
    """The experience's state after a probe measured `gap` (see the module)."""
    if state == EXPERIENCE_RETIRED:
        return state
    if gap < distilled_below:
        return EXPERIENCE_DISTILLED
    if gap > active_above:
        return EXPERIENCE_ACTIVE
    return state
