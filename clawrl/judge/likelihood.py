"""The likelihood judge's pure logic: a few-shot prompt, its label scores, calibration, a vote.

A small model cannot be trusted to write a verdict (the 135M embedded model echoes the rubric
or loops), but it can say which word comes next. So a PRM vote is a completion prompt of
labelled example replies, then the reply to judge and `Label:`; the engine scores each label
word after it (`Engine.score`), and the vote follows the *calibrated* probabilities:

    p(label | prompt)  for label in good / bad                (one token each, T = 1)
    q(label) ∝ p(label | prompt) / p(label | same prompt, content-free reply "N/A")
    vote = +1 if q(good) > 0.5 + MARGIN, -1 if q(bad) > 0.5 + MARGIN, else 0

The division is contextual calibration (Zhao et al., 2021, "Calibrate Before Use"): a few-shot
prompt biases a small model towards the labels of its last examples and its most frequent
ones; dividing by what it says of a reply that carries no information removes that bias.

Two labels, not three: on the labelled set (`bench/judge.py`, one prompt each, embedded model)
good / bad with 3 examples each got corrections, complaints and thanks right 60 of 66, a third
label "neutral" with 2 examples each 39 of 66 (the 135M model read most corrections as neutral),
and a task header before the examples 58 of 66. A 0 comes from a reading too close to call
(MARGIN), or from votes that split; the small judge rarely finds a neutral next state neutral.

A cue layer leans the reading where the user's words say the answer failed (`judge/cues.py`),
or ask, in whatever words, to change it (`judge/change.py`: "could you put it in bold?"):
a small English lexicon of dissatisfaction (too long, padded, off the point, badly formatted,
wrong tone, wrong, not what I asked, ...). With a cue in the reply the calibrated odds of bad
are multiplied by CUE_ODDS (8) before the vote: q'(bad) = 8 q(bad) / (8 q(bad) + q(good)). The
likelihood alone read complaints about an answer's form as 0 or +1 (issue 35: on persona
`brief` never -1), so the policy was rewarded for what the user complained about. Measured on
the embedded model, 3 votes a case, `bench/judge.py` (the likelihood alone is printed beside):
on cases.jsonl, which the lexicon was tuned on, corrections 24 -> 26 of 29, complaints 23 -> 28
of 28, thanks 23 of 23 and neutral follow-ups 4 of 18 unchanged; on heldout.jsonl, phrasings
never tuned on (`--cases clawrl/judge/heldout.jsonl`), complaints 17 -> 22 of 22, corrections 16
of 16, thanks 12 of 12, neutral 4 of 12 unchanged (docs/recording-and-judging.md).

Votes differ by their prompt (`variant`): vote i shows 3 examples of each label, chosen and
ordered by seed i from the pool, so each vote has its own bias and the m votes are m
differently-prompted readings of the same reply. Majority voting over them then means
something, where m samples of one prompt would mostly repeat one argmax. (Sampling from q
instead was the other choice; it makes a confident reading lose votes by chance.) A user's
reply is shown beside users' replies, a tool result beside tool results (two pools).

Quoted words are what the answer said or should say, not the user's verdict: the prompt shows
each quoted phrase as '...', and the cues read only outside quotations (issue 53: "Could you end
with 'Hope that helps!'?" read as thanks; clawrl/judge/quoted.jsonl 12/18 -> 15/18 right sign).

The prompt carries the reply only, as text: the next user message(s), tool results marked
with the tool's name. The question, the answer and the agent's system prompt stay out: what the
next state says about the answer is in the next state, and every token of context costs each
vote a forward pass over it (not measured with them).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from clawrl.algo.teacher import HINT_INTRO
from clawrl.judge.change import change_request
from clawrl.judge.cues import CUE_ODDS, dissatisfaction
from clawrl.judge.prompts import clip, content_text
from clawrl.types import Message

LABELS: tuple[tuple[int, str], ...] = ((1, " good"), (-1, " bad"))
REPLY_CHARS = 600  # the reply shown to the judge, head and tail kept
TOOL_MARK = "[tool "
CONTENT_FREE = "N/A"
PER_LABEL = 4  # examples of each label in one vote's prompt
MARGIN = 0.05  # a vote is 0 unless one label's calibrated probability passes 0.5 + MARGIN

# Written for the prompt only; the labelled set (clawrl/judge/cases.jsonl) is kept apart from it.
# Two pools: a user's reply is judged beside users' replies, a tool result beside tool results
# (a 135M model compares like with like; mixed, it read most tool output as bad).
USER_EXAMPLES: tuple[tuple[str, int], ...] = (
    ("Thank you, that is exactly right.", 1),
    ("Great, that fixed it. Now can you do the same for the other file?", 1),
    ("Perfect, I'll use that one.", 1),
    ("Works now, cheers! Next, add a footer to the page.", 1),
    ("ty, that's what I was looking for", 1),
    ("Nice. Can you also translate it to Spanish?", 1),
    ("No, that's wrong. The answer is 42, please check again.", -1),
    ("This still doesn't work and you ignored what I asked.", -1),
    ("You forgot the second step. Please redo it.", -1),
    ("That is not what I asked for. I wanted it in French.", -1),
    ("Check again: 9 times 7 is 63.", -1),
    ("Too long. Make it two lines.", -1),
)
TOOL_EXAMPLES: tuple[tuple[str, int], ...] = (
    ('[tool read_file] {"content": "host = db.local\\nport = 5432"}', 1),
    ('[tool calculator] {"result": 1764}', 1),
    ("[tool list_files] main.py\nutils.py\nREADME.md", 1),
    ('[tool create_ticket] {"id": 8812, "status": "created"}', 1),
    ("[tool run_python] Traceback: NameError: name 'totl' is not defined", -1),
    ("[tool read_file] Error: no such file: 'confg.yaml'", -1),
    ("[tool search] error: missing required argument 'query'", -1),
    ('[tool sql] syntax error at or near "FORM"', -1),
)


@dataclass(frozen=True)
class Reading:
    """One vote's view: each label's probability, raw and calibrated, and the label chosen."""

    variant: int
    raw: dict[int, float]  # label -> p(label | prompt), renormalised over the labels
    calibrated: dict[int, float]  # label -> q(label), sums to 1
    value: int  # the label past 0.5 + MARGIN once a cue has leaned it, else 0
    cue: str | None = None  # the dissatisfaction cue in the reply (judge/cues.py), if any
    plain: int = 0  # the vote of the likelihood alone, without the cue

    def text(self) -> str:
        """What the vote records as its raw text."""
        shown = " ".join(f"{word.strip()} {self.calibrated[label]:.2f}" for label, word in LABELS)
        cue = f"; cue ({self.cue}): bad x{CUE_ODDS:g}, vote {self.value}" if self.cue else ""
        return f"likelihood vote, prompt variant {self.variant}: {shown} (calibrated){cue}"


# A quoted phrase: in double or typographic quotes, or in single quotes opened after a space (an
# apostrophe inside a word, "that's", opens nothing).
_QUOTED = re.compile(r"[\"“«][^\"”»]*[\"”»]|(^|\s)'[^'\n]+'(?=[\s.,;:!?)-]|$)")


def examples(variant: int, tool: bool) -> list[tuple[str, int]]:
    """The examples of vote `variant`: PER_LABEL of each label from the pool, chosen and ordered by
    its seed."""
    pool = TOOL_EXAMPLES if tool else USER_EXAMPLES
    rng = random.Random(variant)
    chosen = [e for label, _ in LABELS for e in rng.sample([e for e in pool if e[1] == label], PER_LABEL)]
    rng.shuffle(chosen)
    return chosen


def prompt(variant: int, reply: str) -> str:
    """The completion prompt of vote `variant` for `reply`; the next token is the label. A reply that
    starts with a tool result is shown beside tool results."""
    words = {label: word for label, word in LABELS}
    shots = examples(variant, tool=reply.startswith(TOOL_MARK))
    text = "".join(f"Reply: {_one_line(t)}\nLabel:{words[label]}\n\n" for t, label in shots)
    return f"{text}Reply: {_one_line(unquoted(reply))}\nLabel:"


def unquoted(reply: str) -> str:
    """`reply` with each quoted phrase shown as '...': words in quotes are what the answer said or
    should say, not the user's own verdict, and a small model reads their tone as the user's
    ("Could you end with 'Hope that helps!'?" read as thanks: issue 53's `signoff`)."""
    return _QUOTED.sub(lambda m: f"{m.group(1) or ''}'...'", reply)


def content_free(reply: str) -> str:
    """The content-free reply that calibrates `reply`'s prompt: "N/A", from a tool for a tool result."""
    return f"{TOOL_MARK}result] {CONTENT_FREE}" if reply.startswith(TOOL_MARK) else CONTENT_FREE


def reply_text(next_state: list[Message], names: dict[str, str]) -> str:
    """The next state as one reply: each message's text, a tool result marked `[tool NAME]`."""
    parts = []
    for message in next_state:
        text = content_text(message.get("content")).strip()
        if message.get("role") == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id") or "") or "result"
            text = f"{TOOL_MARK}{name}] {text}"
        if text:
            parts.append(text)
    return clip(" ".join(parts), REPLY_CHARS) if parts else "(empty)"


def reading(
    variant: int, logprobs: dict[int, float], content_free: dict[int, float], cue: str | None = None
) -> Reading:
    """The vote from each label's log-probability after the prompt and after the content-free one;
    a dissatisfaction `cue` in the reply multiplies the calibrated odds of "bad" by CUE_ODDS."""
    raw = _normalised({label: math.exp(lp) for label, lp in logprobs.items()})
    bias = _normalised({label: math.exp(lp) for label, lp in content_free.items()})
    calibrated = _normalised({label: raw[label] / max(bias[label], 1e-12) for label in raw})
    leaned = _normalised({label: q * (CUE_ODDS if label == -1 else 1.0) for label, q in calibrated.items()})
    return Reading(
        variant=variant,
        raw=raw,
        calibrated=calibrated,
        value=_vote(leaned if cue else calibrated),
        cue=cue,
        plain=_vote(calibrated),
    )


def cue_of(reply: str) -> str | None:
    """The dissatisfaction cue in a user's reply, or its request to change the answer
    (`judge/change.py`), read outside its quotations (a quoted "is broken" or "could you" is what
    was or should be written, not the user's complaint); a tool result has neither."""
    if reply.startswith(TOOL_MARK):
        return None
    words = unquoted(reply)
    return dissatisfaction(words) or change_request(words)


def _vote(q: dict[int, float]) -> int:
    return next((label for label, p in q.items() if p > 0.5 + MARGIN), 0)


def next_state_hint(next_state: list[Message], names: dict[str, str], limit: int = REPLY_CHARS) -> str:
    """The hint a small judge can give: the next state itself, clipped, saying where it came from."""
    roles = {m.get("role") for m in next_state}
    intro = HINT_INTRO["user" if "user" in roles else "tool"]
    return intro + clip(reply_text(next_state, names), limit)


def _normalised(weights: dict[int, float]) -> dict[int, float]:
    total = sum(weights.values())
    if not total > 0:
        return {label: 1 / len(weights) for label in weights}
    return {label: w / total for label, w in weights.items()}


def _one_line(text: str) -> str:
    return " ".join(text.split())
