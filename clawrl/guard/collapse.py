"""Signs of collapse in a version's answers: pure arithmetic on what the canary measured.

Personalising can narrow a model until it says the same few things to everyone. Three
figures watch for it, each on the general set's canary prompts (`general.py`), against
the base model (v0):

    entropy_ratio = H_version / H_base      H: the mean per-token entropy (nats) of the
                                            model's distribution along its own greedy
                                            answers; collapse when below `min_entropy_ratio`;
                                            a spread (the policy growing random, as batches of
                                            only negative rewards push it) when above
                                            `max_entropy_ratio`
    self_rouge_l  = mean over pairs i < j of ROUGE-L(answer_i, answer_j)
                                            between the version's answers to *different*
                                            prompts; collapse when above `max_self_rouge_l`
                                            and above the base's own (answers *growing*
                                            alike: a base that already answers every
                                            prompt alike, as a tiny random model does, is
                                            not a collapse the version made)
    drift         = mean over probes of | mean_t log p_version(a_t) - mean_t log p_base(a_t) |
                                            on the base's own greedy answers a to the same
                                            prompts (nats per token); collapse when above `max_drift`

ROUGE-L (Lin, 2004) is the F-measure of the longest common subsequence of two word
sequences: P = LCS / len(b), R = LCS / len(a), F = 2PR / (P + R). Words are lowercased
whitespace-separated tokens. Two empty answers are identical (1.0); one empty answer
shares nothing with a non-empty one (0.0). The default limits (0.6, 0.85, 2 nats) are the
ones peers watch while personalising; the spread's 1.5 is ours: issue 53's runs on preferences
the model never writes unprompted served versions at 1.35-1.39x v0's entropy and held one at
1.6x. A figure that is None (no base entropy to compare with, fewer than two answers) crosses
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

from clawrl.types import HELD

ENTROPY, SPREAD, SELF_ROUGE_L, DRIFT = "entropy", "spread", "self_rouge_l", "drift"


@dataclass(frozen=True)
class Limits:
    min_entropy_ratio: float = 0.6
    max_self_rouge_l: float = 0.85
    max_drift: float = 2.0
    max_entropy_ratio: float = 1.5


@dataclass(frozen=True)
class Collapse:
    """A version's collapse figures and which limits they cross (`ENTROPY`, `SPREAD`, `SELF_ROUGE_L`,
    `DRIFT`)."""

    entropy: float | None
    base_entropy: float | None
    entropy_ratio: float | None
    self_rouge_l: float | None
    base_self_rouge_l: float | None
    drift: float | None
    crossed: tuple[str, ...]
    reasons: tuple[str, ...]

    def figures(self) -> dict[str, Any]:
        """As kept in a version's canary figures (`collapse`)."""
        return {
            "entropy": self.entropy,
            "base_entropy": self.base_entropy,
            "entropy_ratio": self.entropy_ratio,
            "self_rouge_l": self.self_rouge_l,
            "base_self_rouge_l": self.base_self_rouge_l,
            "drift": self.drift,
            "crossed": list(self.crossed),
        }


def words(text: str) -> list[str]:
    return text.lower().split()


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence (one row of the dynamic programme at a time)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(a: str, b: str) -> float:
    """ROUGE-L F-measure of two texts' words, in [0, 1]; symmetric."""
    wa, wb = words(a), words(b)
    if not wa and not wb:
        return 1.0
    common = lcs_length(wa, wb)
    if common == 0:
        return 0.0
    precision, recall = common / len(wb), common / len(wa)
    return 2 * precision * recall / (precision + recall)


def self_rouge_l(answers: list[str]) -> float | None:
    """Mean ROUGE-L over every pair of answers to different prompts; None for fewer than two."""
    pairs = list(combinations(answers, 2))
    if not pairs:
        return None
    return sum(rouge_l(a, b) for a, b in pairs) / len(pairs)


def mean_entropy(per_answer: list[float]) -> float | None:
    """The mean of the answers' per-token entropies (None for no answer)."""
    return sum(per_answer) / len(per_answer) if per_answer else None


def entropy_ratio(entropy: float | None, base: float | None) -> float | None:
    """H_version / H_base; None when either is unknown or the base's entropy is 0."""
    if entropy is None or base is None or base <= 0:
        return None
    return entropy / base


def drift(version: list[float], base: list[float]) -> float | None:
    """Mean absolute difference of per-probe mean logprobs (nats per token); None for no probe."""
    if len(version) != len(base):
        raise ValueError(f"{len(version)} probe logprobs for {len(base)} base ones")
    if not base:
        return None
    return sum(abs(v - b) for v, b in zip(version, base, strict=True)) / len(base)


def judge(
    entropy: float | None,
    base_entropy: float | None,
    rouge: float | None,
    base_rouge: float | None,
    drifted: float | None,
    limits: Limits,
) -> Collapse:
    """The figures, with each limit they cross named and explained."""
    ratio = entropy_ratio(entropy, base_entropy)
    crossed, reasons = [], []
    if ratio is not None and ratio < limits.min_entropy_ratio:
        crossed.append(ENTROPY)
        reasons.append(
            f"answer entropy {entropy:.3f} is {ratio:.2f} of the base's {base_entropy:.3f} "
            f"(min {limits.min_entropy_ratio:g})"
        )
    if ratio is not None and ratio > limits.max_entropy_ratio:
        crossed.append(SPREAD)
        reasons.append(
            f"answer entropy {entropy:.3f} is {ratio:.2f} of the base's {base_entropy:.3f} "
            f"(max {limits.max_entropy_ratio:g}): the policy spreads"
        )
    if rouge is not None and rouge > limits.max_self_rouge_l and (base_rouge is None or rouge > base_rouge):
        crossed.append(SELF_ROUGE_L)
        reasons.append(f"self-ROUGE-L {rouge:.3f} between answers > {limits.max_self_rouge_l:g}")
    if drifted is not None and drifted > limits.max_drift:
        crossed.append(DRIFT)
        reasons.append(f"logprob drift {drifted:.3f} nats/token on the probes > {limits.max_drift:g}")
    return Collapse(
        entropy=entropy,
        base_entropy=base_entropy,
        entropy_ratio=ratio,
        self_rouge_l=rouge,
        base_self_rouge_l=base_rouge,
        drift=drifted,
        crossed=tuple(crossed),
        reasons=tuple(reasons),
    )


def hold(status: str, reason: str | None, found: Collapse, hold_on_collapse: bool) -> tuple[str, str | None]:
    """(status, reason) after the collapse limits: held, with their reasons added, only when
    `hold_on_collapse` and a limit was crossed; otherwise the canary's own verdict stands."""
    if not hold_on_collapse or not found.reasons:
        return status, reason
    return HELD, "; ".join([*([reason] if reason else []), *(f"collapse: {r}" for r in found.reasons)])


def describe(figures: dict[str, Any]) -> str:
    """'answer entropy 0.95 of the base's, self-ROUGE-L 0.31 (base 0.28), drift 0.120 nats' from a
    version's `collapse` figures, with ': COLLAPSE entropy, drift' when it crossed limits."""

    def num(key: str, digits: int) -> str:
        return "-" if figures.get(key) is None else f"{figures[key]:.{digits}f}"

    text = (
        f"answer entropy {num('entropy_ratio', 2)} of the base's, self-ROUGE-L {num('self_rouge_l', 2)} "
        f"(base {num('base_self_rouge_l', 2)}), drift {num('drift', 3)} nats"
    )
    crossed = figures.get("crossed") or []
    return f"{text}: COLLAPSE {', '.join(crossed)}" if crossed else text
