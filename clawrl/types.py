"""Typed values that move between the loops (serve, collect, judge, train).

Messages are kept in the OpenAI shape (plain dicts: role, content, tool_calls,
tool_call_id, name) exactly as the request gave them after validation; token
IDs are exactly what the engine saw and produced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

# How a next state was told to follow its answer (clawrl/sessions/tracker.py): the request resent the
# answer's request and the answer (`history`); that request and, in the answer's place, another text
# (`rewritten`: the client stripped, folded or truncated the answer; sessions a request names only);
# or only named the session, its history changed otherwise (`named`: what followed its last answer).
NextStateMatch = Literal["history", "rewritten", "named"]

PASSED, HELD, UNCHECKED = "passed", "held", "unchecked"  # what the canary gate made of a version

TurnType = Literal["main", "side"]
Message = dict[str, Any]


@dataclass
class Turn:
    """One answer the server gave, with everything training needs to reuse it."""

    id: str  # the completion id the client saw (chatcmpl-...)
    session_id: str
    index: int  # 0-based position among the session's turns, main and side alike
    turn_type: TurnType
    messages: list[Message]  # the request's messages
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # per response token, under softmax(logits / temperature)
    response_text: str
    tool_calls: list[dict[str, Any]]  # OpenAI shape, as returned to the client
    finish_reason: str  # stop | length | tool_calls | abort
    versions: list[str]  # policy versions that produced the tokens, in order of first use
    temperature: float
    created_at: float  # request arrival, unix seconds
    finished_at: float
    first_token_at: float | None = None
    next_state: list[Message] | None = None
    next_state_at: float | None = None
    next_state_match: NextStateMatch | None = None  # how it matched; None: no next state, or before m016
    rope_scaled: bool | None = None  # RoPE scaled past the trained window (model/rope.py); None: unknown
    grammar: dict[str, Any] | None = None  # the constraint it was decoded under (chat/grammar.py); None: free
    # What the sampler did beyond the temperature (top_p, top_k, the penalties) and what `logprobs`
    # are of: "tempered" (log_softmax(logits / T) over the full vocabulary, or the grammar's
    # tokens: what the trainer scores) or "processed" (vLLM's, after a nucleus, top-k or penalty:
    # not reproducible by the trainer). None: recorded before this was (tempered).
    sampling: dict[str, Any] | None = None
    # The memory block its prompt carried (clawrl/memory): {"ids": experience ids, "block": text}, or
    # {"ids": [], "dropped": why} when one was picked but left out; None: no memory was used.
    memory: dict[str, Any] | None = None
    # A thinking answer's reasoning (clawrl/chat/reasoning.py): the text of its think block, tags left
    # out; `response_text` is then the content after it, and `response_ids` hold every sampled ID,
    # the block's included. None: no think block (or recorded before m019).
    reasoning: str | None = None
    # The chat template's extra variables the prompt was rendered with (`chat_template_kwargs`, the
    # server's defaults and the request's), so a teacher prompt renders alike. None: none.
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def logprobs_exact(self) -> bool:
        """Whether `logprobs` are of the distribution the trainer scores (see `sampling`): tempered,
        and computed by one version (not from a prefix's KV an older version computed)."""
        s = self.sampling
        return s is None or (s.get("logprobs", "tempered") == "tempered" and "prefix_kv_version" not in s)

    @property
    def policy_version(self) -> str:
        """The version that started the turn."""
        return self.versions[0] if self.versions else "v0"

    def answer_message(self) -> Message:
        """The assistant message as the client received it (and will echo back)."""
        message: Message = {"role": "assistant", "content": self.response_text or None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


# Why the trainer skipped a sample: its reason starts with one of these, then ": " and the
# detail (clawrl/train/trainer.py); the store counts skipped samples by them.
SKIP_REASONS = (
    "empty response",
    "bad logprobs",
    "too long",
    "no teacher prompt",
    "unknown tokens",
    "failed step",  # two training steps with it in the batch raised (clawrl/train/failures.py)
)


@dataclass
class Feedback:
    """An explicit rating of one turn, from POST /v1/feedback."""

    turn_id: str
    rating: int  # +1 or -1
    comment: str | None = None
    created_at: float = field(default_factory=time.time)
    id: int | None = None  # assigned by the store


@dataclass
class Vote:
    """One judge call: its raw text, what it parsed to, how long it took, why it failed."""

    kind: Literal["prm", "hint"]
    value: int | None  # prm: +1 / 0 / -1; hint: +1 (useful hindsight) / -1 (none); None: failed
    raw: str | None = None  # the judge's text (None when the call itself failed)
    hint: str | None = None  # hint votes with value +1: the text between the markers
    latency_s: float = 0.0
    error: str | None = None  # timeout, http status, unparseable, ... (None when it worked)


@dataclass
class Judgment:
    """What the judge made of one turn. The latest judgment of a turn is the one that counts."""

    turn_id: str
    judge: str  # which judge: "openai:<model>", "local:<version>", "feedback"
    votes: list[Vote]
    score: int | None  # PRM majority in {-1, 0, +1} (ties and all-failed give 0); None if not scored
    hint: str | None  # the accepted hint, if any
    created_at: float = field(default_factory=time.time)
    id: int | None = None


SampleKind = Literal["rl", "opd"]
# Where a teacher prompt carries the hint (`train.hint_placement`, clawrl/algo/teacher.py).
HintPlacement = Literal["append", "follow_up"]


@dataclass
class Sample:
    """One training example made from a turn and its judgment.

    The trainer scores `response_ids` after `prompt_ids` with the live policy, and
    for `opd` also after `teacher_prompt_ids` (the prompt with the hint added).
    """

    turn_id: str
    kind: SampleKind
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # behaviour logprobs recorded at serving (logp_old)
    version: str  # the policy version that produced the response
    temperature: float
    reward: float = 0.0  # rl: r in {-1, 0, +1}; the advantage weight of the sample
    hint: str | None = None
    teacher_prompt_ids: list[int] | None = None  # opd: the enhanced prompt's IDs
    loss_mask: list[int] | None = None  # per response token; None means all ones
    judgment_id: int | None = None
    rope_scaled: bool | None = None  # as its turn was served: the trainer scores it the same way
    grammar: dict[str, Any] | None = None  # as its turn was decoded: the trainer scores under the same mask
    # False: `logprobs` are not of the distribution the trainer scores (Turn.sampling); trained on-policy.
    logprobs_exact: bool = True
    experience_id: int | None = None  # unused: rows written before `experience_ids` carry it (None)
    # Memory distillation (clawrl/algo/distill.py): the experiences whose block the teacher prompt read
    # and the student prompt lacks; None: not a distillation sample.
    experience_ids: list[int] | None = None
    # A hint rewrite (clawrl/algo/rewrite.py): its response is the policy's answer to the hinted prompt,
    # so it trains beside its turn's own sample of the same kind, not instead of it.
    rewrite: bool = False
    status: str = "ready"  # ready | training (claimed by a step) | trained | stale | skipped | superseded
    created_at: float = field(default_factory=time.time)
    id: int | None = None
    attempts: int = 0  # training steps that failed with it in the batch (the store counts them: m020)


EXPERIENCE_ACTIVE, EXPERIENCE_DISTILLED, EXPERIENCE_RETIRED = "active", "distilled", "retired"
# The user of a server without users (`server.users`), and of the admin key's own requests.
DEFAULT_USER = "default"
DEFAULT_OWNER = DEFAULT_USER  # whose experiences: one owner on a single-user server


@dataclass
class Experience:
    """One lesson about a user's wishes (clawrl/memory): a short sentence and where it was learnt.

    `state`: `active` (added to the system prompts of that owner's requests), `distilled` (trained
    into the weights: the retirement probe found the bare policy already does it; not injected, and
    `active` again when the effect is lost) or `retired` (erased by its user: never injected again,
    and a similar lesson learnt later merges into it and stays retired).
    """

    text: str
    turn_ids: list[str]  # provenance: the turns whose hint or comment held it
    session_ids: list[str]  # ... and their sessions
    owner: str = DEFAULT_OWNER
    state: str = EXPERIENCE_ACTIVE
    seen: int = 1  # distinct turns that taught it
    from_comment: bool = False  # taught by its owner's own rating comment (trusted at once; else 2 sessions)
    created_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    retired_at: float | None = None
    gap: float | None = None  # the last retirement probe's mean logprob gap, memory on vs off (nats/token)
    probed_at: float | None = None  # when that probe ran (None: never probed)
    id: int | None = None


EPISODE_OK, EPISODE_DROPPED = "ok", "dropped"
GROUP_OPEN, GROUP_USED, GROUP_DROPPED, GROUP_EVAL = "open", "used", "dropped", "eval"


@dataclass
class Episode:
    """One run of an agent in an environment (Track 2, clawrl/envs): one session, one reward.

    Posted to `POST /v1/episodes` when it ends. `reward` None means the episode
    was dropped (its reward was not a finite number, its task row did not fit the
    environment, ...) and `reason` says why; otherwise `reason` says how it ended
    (`done`, `answered`, `turn_limit`, `token_limit`, ...).
    """

    session_id: str
    group_id: str
    group_size: int  # G: the group is complete when this many episodes are in
    reward: float | None
    reason: str | None = None
    task: str | None = None
    env: str | None = None
    turns: int = 0
    tool_calls: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    train: bool = True  # False: an evaluation episode, recorded but never trained on
    created_at: float = field(default_factory=time.time)
    id: int | None = None

    @property
    def status(self) -> str:
        return EPISODE_DROPPED if self.reward is None else EPISODE_OK


@dataclass
class Group:
    """G episodes of one task; when all are in, the grpo method uses it or drops it (reason says why)."""

    id: str
    size: int
    task: str | None = None
    env: str | None = None
    status: str = GROUP_OPEN  # GROUP_OPEN | GROUP_USED | GROUP_DROPPED | GROUP_EVAL (not for training)
    reason: str | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    samples: int = 0
    received: int = 0  # episodes in so far (counted, not stored)
    created_at: float = field(default_factory=time.time)
    closed_at: float | None = None


@dataclass
class Version:
    """One published set of policy weights; `v0` is the base model.

    `path` is the checkpoint folder (None for v0, and for a LoRA rollback to v0).
    A rollback publishes a new version whose folder is a copy of an earlier
    one's, so versions only grow.

    `status` is what the canary gate (clawrl.guard) made of it: `passed`,
    `held` (never served; `canary["reason"]` says why) or `unchecked` (no
    canary ran: the gate is off, a rollback, or a version from before the
    gate). `canary` holds the figures the gate measured.
    """

    name: str
    step: int
    path: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None
    created_at: float = field(default_factory=time.time)
    status: str = UNCHECKED  # PASSED | HELD | UNCHECKED
    canary: dict[str, Any] | None = None

    @property
    def held(self) -> bool:
        return self.status == HELD

    @property
    def number(self) -> int:
        return int(self.name.rsplit("v", 1)[1])  # "v3", "alice/v3": the last "v" is the version's

    @property
    def user(self) -> str:
        """Whose line of versions it is on: "alice" for `alice/v3`, `default` for `v3` (and v0)."""
        return self.name.partition("/")[0] if "/" in self.name else DEFAULT_USER

    def canary_note(self) -> str:
        """'canary 0.4120 (-1.2%), KL 0.0123: passed in 2.1 s' (the reason when held), '' unchecked."""
        c = self.canary
        if not c:
            return ""
        return f"{canary_figures(c)}: {self.status}{canary_reason(c)} in {c['seconds']:.1f} s"


def canary_figures(canary: dict[str, Any]) -> str:
    """'canary 0.4120 (-1.2%), KL 0.0123' from a version's canary figures (KL '-' when not measured),
    with ', collapse: entropy, drift' when it crossed collapse limits (clawrl/guard/collapse.py)."""
    kl = "-" if canary.get("kl") is None else f"{canary['kl']:.4f}"
    crossed = (canary.get("collapse") or {}).get("crossed")
    marked = f", collapse: {', '.join(crossed)}" if crossed else ""
    return f"canary {canary['score']:.4f} ({-canary['drop']:+.1%}), KL {kl}{marked}"


def canary_reason(canary: dict[str, Any]) -> str:
    """' (why it was held)', or '' for a version that passed."""
    return f" ({canary['reason']})" if canary.get("reason") else ""
