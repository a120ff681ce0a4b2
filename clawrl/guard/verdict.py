"""The canary's verdict on one version: pure arithmetic on its figures.

    drop          = (base_score - score) / base_score           the relative fall of the likelihood score
    accuracy_drop = (base_accuracy - accuracy) / base_accuracy  the relative fall of the right answers
    held  when drop > guard.max_drop  or  accuracy_drop > guard.max_accuracy_drop  or  kl > guard.max_kl

A version that improves on the base has a negative drop. With no recent turn
to measure it on, the KL is None; without greedy answers (or a base that
answers none right) the accuracy is None; a None figure does not decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from clawrl.types import HELD, PASSED


@dataclass(frozen=True)
class Verdict:
    status: str  # passed | held
    drop: float  # relative fall of the canary score below the base's (negative: better)
    reason: str | None  # why it is held; None when it passed
    accuracy_drop: float | None = None  # relative fall of the greedy accuracy below the base's


def decide(
    base: float,
    score: float,
    kl: float | None,
    max_drop: float,
    max_kl: float,
    accuracy: tuple[float, float] | None = None,
    max_accuracy_drop: float = 1.0,
) -> Verdict:
    """Held when the score falls more than `max_drop` (a fraction) below the base's, the accuracy
    (`(base, version)`) more than `max_accuracy_drop`, or `kl` exceeds `max_kl`."""
    if base <= 0:
        raise ValueError(f"the base canary score must be positive, got {base}")
    drop = (base - score) / base
    reasons = []
    if drop > max_drop:
        reasons.append(f"canary {score:.4f} is {drop:.1%} below the base's {base:.4f} (max {max_drop:.1%})")
    accuracy_drop = None
    if accuracy is not None and accuracy[0] > 0:
        accuracy_drop = (accuracy[0] - accuracy[1]) / accuracy[0]
        if accuracy_drop > max_accuracy_drop:
            reasons.append(
                f"right answers {accuracy[1]:.1%} are {accuracy_drop:.1%} below the base's {accuracy[0]:.1%}"
            )
    if kl is not None and kl > max_kl:
        reasons.append(f"KL(base || version) {kl:.4f} nats/token > {max_kl:g}")
    return Verdict(HELD if reasons else PASSED, drop, "; ".join(reasons) or None, accuracy_drop)
