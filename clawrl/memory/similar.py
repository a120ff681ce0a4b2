"""When two experiences say the same thing, and how relevant one is to a request.

Both read *normalised tokens*: lowercase words of letters, stop words ("the", "a", "to",
"user", "always", ...) left out, a plural or verb "s" (not "ss") and an "-ing" / "-ed" ending cut, so
"Keep answers short" and "keeps the answer short" are the same set.

- `similarity(a, b)`: the Jaccard index of the two token sets, |A ∩ B| / |A ∪ B| (0 when
  either is empty). Two experiences at `MERGE_AT` (0.6) or more are one.
- `best_match(text, candidates)`: the candidate a new lesson merges into, or None.
- `fts_query(text)`: an FTS5 MATCH expression, the tokens OR-ed and quoted, so user text
  never reaches FTS5's query syntax.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeVar

MERGE_AT = 0.6

_STOP = (
    "a an the and or but of to in on at for with by from as is are be been being it its this that these "
    "those i me my you your he she they them their we our user user's users always never please just "
    "so very really also then than there here do does did not no don't into about up out"
)
STOP_WORDS = frozenset(_STOP.split())
_WORD = re.compile(r"[a-z][a-z']*")
T = TypeVar("T")


def tokens(text: str) -> frozenset[str]:
    """The normalised tokens of `text` (see the module)."""
    return frozenset(
        _stem(w.strip("'")) for w in _WORD.findall(text.lower()) if w.strip("'") not in STOP_WORDS
    )


def similarity(a: str | frozenset[str], b: str | frozenset[str]) -> float:
    """Jaccard index of the normalised token sets of `a` and `b` (text or tokens already made)."""
    ta = tokens(a) if isinstance(a, str) else a
    tb = tokens(b) if isinstance(b, str) else b
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / len(ta | tb)


def best_match(text: str, candidates: Iterable[tuple[T, str]], at_least: float = MERGE_AT) -> T | None:
    """Of `(key, text)` candidates, the key of the most similar one at `at_least` or more (ties: first)."""
    mine = tokens(text)
    best, best_score = None, at_least
    for key, other in candidates:
        score = similarity(mine, other)
        if score >= best_score and (best is None or score > best_score):
            best, best_score = key, score
    return best


def fts_query(text: str, most: int = 32) -> str | None:
    """An FTS5 MATCH expression for `text`: its first `most` distinct stemmed words OR-ed, each
    quoted and a prefix (`"answer"*` finds "answers"); None when it has none."""
    stems = (_stem(w.strip("'")) for w in _WORD.findall(text.lower()) if w.strip("'") not in STOP_WORDS)
    words = list(dict.fromkeys(s for s in stems if s))[:most]
    if not words:
        return None
    return " OR ".join(f'"{w}"*' for w in words)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "s"):
        if word.endswith(suffix) and not word.endswith("ss") and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word
