"""Training methods: how a judged turn becomes training samples.

All methods share one PPO-style clipped surrogate (clawrl.train) and differ in
the per-token advantage A_t and in which turns they keep:

| name      | class                | advantage A_t                                  | samples            |
| --------- | -------------------- | ---------------------------------------------- | ------------------ |
| `rl`      | BinaryRL             | r, the PRM vote in {-1, 0, +1}                 | `rl` if r != 0 (*) |
| `opd`     | OnPolicyDistillation | logp_teacher - logp_old                        | `opd` if hinted    |
| `combine` | Combine              | w_rl * r + w_opd * (logp_teacher - logp_old)   | one (**)           |
| `grpo`    | GroupRelative        | (R_i - mean R) / (std R + eps), per episode    | `rl` per main turn |

logp_teacher = log pi(a_t | s + hint), the response token under the enhanced
prompt (clawrl.algo.teacher); logp_old = the behaviour logprob recorded at
serving. grpo (Track 2) reads no judgment of its own: R_i is the reward the environment
gave episode i of a group of G episodes of one task (clawrl/algo/grpo.py).
(*) At-least-one guarantee: a session that gave no `rl` sample
contributes its first scored turn (reward 0) when it ends.
(**) A hinted turn gives one `opd` sample carrying r as its reward (its tokens count once), an
unhinted one an `rl` sample if r != 0 (*). `Method.per_rating` says how many a rating makes.

Besides the method, a turn served with a memory block gives a memory distillation sample
(clawrl/algo/distill.py: an `opd` sample whose student prompt lacks the block and whose teacher
prompt is the one served), whatever the method. With `train.hint_rewrite`, a turn judged with a
hint and not good also gives a rewrite sample (clawrl/algo/rewrite.py: the policy's answer to the
hinted prompt, distilled into the bare one), whatever the method. Side turns, aborted turns and turns without
response tokens never give samples. A new method is one small module here, added to `METHODS`.
"""

from __future__ import annotations

from clawrl.algo.base import Method, TeacherPrompt, eligible, make_sample
from clawrl.algo.combine import Combine
from clawrl.algo.grpo import EpisodeTurns, GroupOutcome, GroupRelative
from clawrl.algo.opd import OnPolicyDistillation
from clawrl.algo.rl import BinaryRL

METHODS: dict[str, Method] = {
    m.name: m for m in (BinaryRL(), OnPolicyDistillation(), Combine(), GroupRelative())
}


def get_method(name: str) -> Method:
    """The registered method called `name`; KeyError naming the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}") from None


__all__ = [
    "METHODS",
    "EpisodeTurns",
    "GroupOutcome",
    "GroupRelative",
    "Method",
    "TeacherPrompt",
    "eligible",
    "get_method",
    "make_sample",
]
