"""Hint rewrites: the answer the policy writes with the hint in its prompt, distilled into the bare prompt.

On-policy distillation (opd.py) rescores the turn's *own* tokens under the hint: it reshapes what
the policy already wrote, but it cannot bring in a behaviour the policy never samples. Issue 53's
preferences showed it: the embedded 135M model wrote no bold number, no numbered steps and no
"Hope that helps!" in any of its answers, so every next message read -1, the opd samples had
nothing to lift, and the uniform -1 spread the policy's mass instead (answer entropy 1.35x v0's
at v2). With the hint in its prompt the same model writes them often enough to learn from
(3, 8 and 4 of 16 sampled answers; 0 of 16 without it). A rewrite sample is that answer:

    a' ~ pi(. | s + hint)                     the served policy, sampled as the turn was
    A_t = w_opd * clip(logp(a'_t | s + hint) - logp(a'_t | s), -c, c)    trained on the bare prompt s

so the tokens the hint made likely (the `**`, the `1.`, the sign-off) are pushed up for the prompt
that lacks it: context distillation on the teacher's own samples. It is an `opd` sample with
reward 0 (train/advantages.py), its response the rewrite's IDs. It keeps no behaviour logprobs,
so the trainer weighs it 1: a truncated importance weight min(exp(prox - mu), C) would divide by
the teacher's own probability and cancel exactly the tokens the hint brought.

Made for a judged turn with a hint whose answer did not satisfy (score -1 or 0), beside the
method's own samples and superseded with them; marked `rewrite`, so training the turn's own `opd`
sample does not skip it as the turn's second sample of that kind (clawrl/store/versions.py). Off
by default (`train.hint_rewrite`): one generation per such turn, on the serving engine.
"""

from __future__ import annotations

from clawrl.algo.base import eligible
from clawrl.types import DEFAULT_USER, Judgment, Sample, Turn


def wants_rewrite(turn: Turn, judgment: Judgment) -> bool:
    """A main turn, judged with a hint, whose answer the judgment did not call good."""
    return eligible(turn) and bool(judgment.hint) and (judgment.score or 0) <= 0


def rewrite_sample(
    turn: Turn, judgment: Judgment, teacher_prompt_ids: list[int], response_ids: list[int], version: str
) -> Sample | None:
    """The rewrite's sample: the bare prompt, the rewrite's tokens, the hinted prompt as teacher; None
    when the rewrite wrote nothing."""
    if not response_ids:
        return None
    return Sample(
        turn_id=turn.id,
        kind="opd",
        prompt_ids=list(turn.prompt_ids),
        response_ids=list(response_ids),
        logprobs=[],  # none kept: weighed 1 (see the module)
        version=version,
        temperature=turn.temperature,
        rope_scaled=turn.rope_scaled,
        reward=0.0,
        hint=judgment.hint,
        teacher_prompt_ids=list(teacher_prompt_ids),
        judgment_id=judgment.id,
        rewrite=True,
    )


def turn_user(turn: Turn) -> str:
    """Whose adapter served the turn: "alice" for `alice/v3`, the default user otherwise."""
    version = turn.policy_version
    return version.partition("/")[0] if "/" in version else DEFAULT_USER
