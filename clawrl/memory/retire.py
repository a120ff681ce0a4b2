"""Retired when learned: whether the policy already does what an experience asks (pure).

The retirement probe (clawrl/train/memory_probe.py) scores the policy's own answers to a few of
the owner's newest prompts twice: with a memory block of one experience (the memory-augmented
policy) and with an empty block, the header alone (the reference). Per answer it takes the mean
per-token logprob gap, teacher minus reference (the advantage memory distillation trains on,
clawrl/algo/distill.py, with the header on both sides):

    g_i = mean_t [ log pi(a_t | s_i + header + e) - log pi(a_t | s_i + header) ]
    gap(e) = mean_i |g_i|

gap(e) near 0 means the experience's words no longer change what the policy says: the weights
already do it, and the experience is `distilled` (no longer injected). Hysteresis keeps it from
flapping: `distilled` under `distilled_below`, `active` again over `active_above`, and between the
two the state stays. A `retired` experience (erased by its user) is never moved.

Why the header on both sides, not the bare prompt: any system text moves a policy's logprobs a
little, whatever it says. On the embedded SmolLM2-135M (bench/memory_probe.py, four questions,
32-token greedy answers written without the wish), "Call me Sam." measured 0.056 nats a token
against the bare prompt and 0.012 against the header alone; "Answer in French please." 0.221 and
0.177. Against the bare prompt every experience carries that floor (~0.04 there) and would never
fall under a small threshold however well the weights learnt it.

A limit to know: on prompts where the experience does not apply ("Call me Sam." on questions
that never address the user) the gap is small too; the probe reads the newest prompts, so an
experience that no recent prompt calls for can be marked distilled, and it is `active` again once
prompts that call for it show the gap.
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
