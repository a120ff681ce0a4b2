"""What a training method is: judged turns in, training samples out.

A method looks at one turn with its latest judgment and returns the samples
it trains on (`samples`), and when a session ends it may add samples from
the session as a whole (`session_end`). Methods are pure: the teacher prompt
is rendered by a `TeacherPrompt` function given to them, and advantages are
computed later by the trainer from the sample's kind and reward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from clawrl.types import Judgment, Sample, SampleKind, Turn

TeacherPrompt = Callable[[Turn, str], list[int]]
"""(turn, hint) -> the prompt IDs of the turn's messages with the hint added."""


class Method(Protocol):
    """A training method; see clawrl.algo for the ones there are."""

    name: str
    wants_prm: bool  # needs PRM votes (Judgment.score)
    wants_hint: bool  # needs hint votes (Judgment.hint)

    def samples(self, turn: Turn, judgment: Judgment, teacher: TeacherPrompt) -> list[Sample]:
        """The samples one judged turn gives (possibly none)."""
        ...

    def per_rating(self, score: int, hinted: bool) -> int:
        """How many samples `samples` makes from an eligible turn judged `score`, with an accepted
        hint or not (a client pacing its ratings counts them: clawrl/eval/pacing.py)."""
        ...

    def session_end(self, scored: list[tuple[Turn, Judgment]], emitted_rl: int) -> list[Sample]:
        """Extra samples when a session ends.

        `scored`: the session's turns with their latest judgment; `emitted_rl`:
        how many `rl` samples were already made from the session.
        """
        ...


def eligible(turn: Turn) -> bool:
    """Whether a turn can be trained on at all: a main turn, not aborted, with response tokens."""
    return turn.turn_type == "main" and turn.finish_reason != "abort" and bool(turn.response_ids)


def make_sample(
    turn: Turn,
    judgment: Judgment | None,
    kind: SampleKind,
    reward: float = 0.0,
    hint: str | None = None,
    teacher_prompt_ids: list[int] | None = None,
) -> Sample:
    """A sample of the turn's own prompt, response and behaviour logprobs (copied, never altered)."""
    return Sample(
        turn_id=turn.id,
        kind=kind,
        prompt_ids=list(turn.prompt_ids),
        response_ids=list(turn.response_ids),
        logprobs=list(turn.logprobs),
        version=turn.policy_version,
        temperature=turn.temperature,
        rope_scaled=turn.rope_scaled,
        grammar=turn.grammar,
        logprobs_exact=turn.logprobs_exact,
        reward=reward,
        hint=hint,
        teacher_prompt_ids=teacher_prompt_ids,
        judgment_id=judgment.id if judgment is not None else None,
    )
