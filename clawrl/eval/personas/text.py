"""Small text checks the scripted personas share: numbers in an answer, word counts, picks.

`numbers_in` reads digits ("9", "9.0", "1,200") and the number words zero to twenty
("nine"), which is how a plain-prose answer tends to state a small result.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

# A thousands-grouped number first ("1,200"), so "3,4" still reads as 3 and 4.
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)


def numbers_in(text: str) -> list[float]:
    """Every number written in `text`, in digits or as a word from zero to twenty."""
    found = [float(m.group().replace(",", "")) for m in _NUMBER.finditer(text)]
    found += [float(_WORDS.index(m.group().lower())) for m in _NUMBER_WORD.finditer(text)]
    return found


def mentions_answer(text: str, answer: float) -> bool:
    """Whether `text` states the number `answer` anywhere ("9", "9.0", "nine", "1,200")."""
    return any(abs(n - answer) < 1e-9 for n in numbers_in(text))


def word_count(text: str) -> int:
    return len(text.split())


def pick(options: Sequence[str], *keys: object) -> str:
    """One of `options`, chosen by a stable hash of `keys` (never Python's salted `hash`)."""
    return options[stable_hash(*keys) % len(options)]


def stable_hash(*keys: object) -> int:
    return zlib.crc32("\x1f".join(map(str, keys)).encode())


def join_words(items: Sequence[str], last: str = "or") -> str:
    """'a', 'a or b', 'a, b or c'."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"


def length_credit(words: int, limit: int, zero_at: int) -> float:
    """1 up to `limit` words, falling linearly to 0 at `zero_at` words."""
    return 1.0 if words <= limit else max(0.0, 1.0 - (words - limit) / (zero_at - limit))


def long_enough_credit(words: int, least: int) -> float:
    """1 from `least` words on, falling linearly to 0 at a quarter of that."""
    floor = least // 4
    return 1.0 if words >= least else max(0.0, (words - floor) / (least - floor))


def last_number(text: str) -> float | None:
    """The number written last in `text` (digits or a word from zero to twenty); None if none."""
    found = [(m.start(), m.group().replace(",", "")) for m in _NUMBER.finditer(text)]
    found += [(m.start(), str(_WORDS.index(m.group().lower()))) for m in _NUMBER_WORD.finditer(text)]
    return float(max(found)[1]) if found else None
