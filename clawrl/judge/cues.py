"""Dissatisfaction cues: the words with which users say an answer failed, read beside the likelihood.

The 135M judge reads a correction of a fact well, but a complaint about an answer's *form* (too
long, padded, off the point, badly formatted, the wrong tone or language) often reads to it like
any other short reply, so it gave such complaints 0 or +1 and the policy was rewarded for what
the user complained about. These phrases are rarely written by a satisfied user, so where one
appears the vote leans to "bad": the calibrated odds of bad are multiplied by `CUE_ODDS`
(`likelihood.reading`). A strong "good" reading can still win; a cue never makes a vote +1.

The lexicon is English and written from the kinds of complaint, not from the labelled sets'
replies; it is tuned on clawrl/judge/cases.jsonl and checked on heldout.jsonl (bench/judge.py).
It is read on users' words only: a tool result is judged by the likelihood alone.
"""

from __future__ import annotations

import re

# A cue multiplies the calibrated odds of "bad" by this (log-odds + 2.1): the smallest of 1, 2, 4, 6,
# 8, 12, 16 that read every complaint of cases.jsonl -1 (from one bench run's recorded readings);
# a "good" reading above 0.91 still wins.
CUE_ODDS = 8.0

# kind -> patterns; matched case-insensitively on the user's words
CUES: dict[str, tuple[str, ...]] = {
    "length": (
        r"\b(too (long|wordy|verbose|much)|way too)\b",
        r"\bmore than i (needed|asked|wanted)\b",
        r"\b(condense|caveats|disclaimers|less (chatty|wordy|detail))\b",
        r"\b(shorter|shorten|briefer|more concise|cut it down|trim it)\b",
        r"\btl;? ?dr\b",
        r"\bwall of text\b",
        r"\b(fluff|filler|padding|padded|waffle|waffling|rambl\w*|long-winded|verbose)\b",
        r"\bpreamble\b",
        r"\bget to the point\b",
        r"\bjust (give me |tell me )?(the )?(answer|number|result|command|code|name|date)\b",
        r"\bno (working|explanations?|preamble|intro)\b",
        r"\bone (short )?(sentence|line)\b",
    ),
    "point": (
        r"\bnot what i (asked|wanted|meant|need)\b",
        r"\bi (didn't|did not|never) ask\b",
        r"\b(off[- ]topic|tangent|irrelevant|beside the point|off the point|not the point)\b",
        r"\b(doesn't|does not|didn't|did not) answer\b",
        r"\bdid you (even )?read\b",
        r"\b(a )?different question\b",
        r"\bi (said|asked for|told you|already)\b",
        r"\bthe question i (actually )?asked\b",
        r"\bsomething else\b",
    ),
    "form": (
        r"\b(formatting|badly formatted|unformatted|unreadable|a mess|messy|garbled)\b",
        r"\b(didn't|did not|doesn't|does not|won't) render\b",
        r"\b(is|are|'s) (all )?(broken|messed up|off)\b",
        r"\b(can't|cannot|can not) read (this|that|it)\b",
        r"\b(isn't|not) indented\b",
        r"\b(reads|sounds) like\b",
        r"\bkeep it (neutral|professional|simple|short|brief|plain)\b",
        r"\b(english|my language) please\b",
        r"\bwhy (are|is) (you|this|it) (answering|writing|replying|written)\b",
        r"\btoo (formal|casual|informal|stiff|robotic|bossy|rude|cheesy|vague|technical|complicated)\b",
        r"\b(wrong|weird) (language|tone)\b",
    ),
    "wrong": (
        r"\b(wrong|incorrect|inaccurate|mistaken)\b",
        r"\bnot (right|correct|true|quite)\b",
        r"^\W*(no|nope|nah)\b(?! (problem|worries))",
        r"\boff by\b",
        r"\b(making things up|made (that|it|this) up)\b",
        r"\b(recheck|check again|try again|redo|fix (it|this|that))\b",
        r"\bstill (wrong|broken|doesn't|does not|fails|crashes|the same)\b",
        r"\b(doesn't|does not|didn't|won't) (work|compile|run)\b",
        r"\byou (forgot|missed|ignored|misread|misspelled|repeated)\b",
        r"\b(useless|pointless|unhelpful|not helpful|thanks for nothing)\b",
    ),
    "give_up": (  # the user stops asking: `clawrl eval` personas' "Never mind, I'll sort it out myself."
        r"\b(never ?mind|forget it)\b",
        r"\b(do|sort|figure|work) (it|this) out myself\b",
    ),
}
_COMPILED = [(kind, re.compile(p, re.IGNORECASE)) for kind, ps in CUES.items() for p in ps]


def dissatisfaction(words: str) -> str | None:
    """The first cue in `words` as `kind: matched text`, or None."""
    for kind, pattern in _COMPILED:
        if found := pattern.search(words):
            return f"{kind}: {found.group(0).strip()}"
    return None
