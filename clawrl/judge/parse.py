"""Reading the judge's replies.

A PRM reply ends with its score as `\\boxed{1}`, `\\boxed{0}` or `\\boxed{-1}`; a hint
reply decides with `\\boxed{1}` / `\\boxed{-1}` and puts the hint between
`[HINT_START]` and `[HINT_END]`. The LAST box counts: judges reason first and
sometimes quote the format while doing so.

Exceptions:
    Unparseable(ValueError)  the reply holds no usable decision; the caller records a failed
                             vote (value None), never a silent 0.
"""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
SCORE = re.compile(r"([+-]?)([01])(?:\.0*)?")
HINT_START = "[HINT_START]"
HINT_END = "[HINT_END]"


class Unparseable(ValueError):
    """A judge reply without a usable decision (no box, a box holding something else, no hint)."""


def parse_prm(text: str) -> int:
    """+1, 0 or -1 from the last `\\boxed{...}`; `+1`, ` -1 `, `1.0` are accepted."""
    return _last_box(text, allowed=(-1, 0, 1))


MAX_HINT_CHARS = 600


def parse_hint(text: str) -> tuple[int, str | None]:
    """(+1, hint) when the judge found hindsight, (-1, None) when it found none.

    The hint is the last `[HINT_START]` block, whitespace collapsed; a block cut off
    before `[HINT_END]` runs to the next box or the end of the text.
    """
    decision = _last_box(text, allowed=(-1, 1))
    if decision == -1:
        return -1, None
    hint = _last_hint(text)
    if not hint:
        raise Unparseable(f"decision \\boxed{{1}} without a hint between {HINT_START} and {HINT_END}")
    if len(hint) > MAX_HINT_CHARS:  # a rambling, cut-off judge; "longest wins" must not pick it
        raise Unparseable(f"hint of {len(hint)} characters (at most {MAX_HINT_CHARS}: 1-3 sentences)")
    return 1, hint


def _last_box(text: str, allowed: tuple[int, ...]) -> int:
    boxes = BOXED.findall(text)
    if not boxes:
        raise Unparseable("no \\boxed{...} decision in the reply")
    match = SCORE.fullmatch(boxes[-1].strip().replace("\u2212", "-"))  # U+2212: typeset minus
    if match:
        value = (-1 if match.group(1) == "-" else 1) * int(match.group(2))
        if value in allowed:
            return value
    expected = ", ".join(str(a) for a in allowed)
    raise Unparseable(f"last box \\boxed{{{boxes[-1]}}} is not one of {expected}")


def _last_hint(text: str) -> str | None:
    start = text.rfind(HINT_START)
    if start < 0:
        return None
    body = text[start + len(HINT_START) :]
    end = body.find(HINT_END)
    if end < 0:  # cut off (or the marker forgotten): stop at a decision box written after it
        box = BOXED.search(body)
        end = box.start() if box else len(body)
    return " ".join(body[:end].split()) or None
