"""Memory: what the user's feedback taught about their wishes, kept as experiences and used in later
sessions' system prompts (docs/memory.md). Pure functions only; the store keeps the experiences
(`clawrl/store/memory.py`), the judge loop learns them, the gateway injects them.

lessons.py   a hint or a rating's comment -> short sentences about the user's wishes
similar.py   normalised tokens, the similarity two experiences merge at, FTS5 queries
block.py     the experiences a request gets within a token budget, and the system-prompt block
retire.py    whether the bare policy already does what an experience asks: active <-> distilled
"""

from clawrl.memory.block import HEADER, Recalled, recall, render, with_memory
from clawrl.memory.lessons import MAX_CHARS, cap, lessons
from clawrl.memory.retire import answer_gap, experience_gap, next_state
from clawrl.memory.similar import MERGE_AT, best_match, fts_query, similarity, tokens

__all__ = [
    "HEADER",
    "MAX_CHARS",
    "MERGE_AT",
    "Recalled",
    "answer_gap",
    "best_match",
    "cap",
    "experience_gap",
    "fts_query",
    "lessons",
    "next_state",
    "recall",
    "render",
    "similarity",
    "tokens",
    "with_memory",
]
