"""The general capability set the canary scores and replay anchors: short prompts, reference answers.

`general.jsonl` holds 48 everyday questions (facts, arithmetic, word forms),
written for this project, each with a one-sentence reference answer and a
`key` (the words, `|`-separated, a right answer contains: `is_right`). It has two halves:

- `canary` (32 items): what the canary scores on every version;
- `replay` (16 items): what `train.replay_fraction` trains towards the base
  model. The canary never scores these, so replay cannot flatter the canary
  by anchoring the very answers it measures.

An item is encoded as the server would serve it: the prompt through the
model's chat template (`ChatRenderer`, as a request is rendered), and the
reference as the answer's tokens followed by the end-of-turn token, so a
version that stops ending its answers loses probability too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.chat.template import ChatRenderer

GENERAL_SET = Path(__file__).with_name("general.jsonl")
SPLITS = ("canary", "replay")


@dataclass(frozen=True)
class Item:
    id: str
    split: str
    prompt: str
    reference: str
    key: str  # `|`-separated words; a right answer contains one of them


@dataclass(frozen=True)
class Encoded:
    """One item as token ids: the rendered prompt, and the reference answer it should get."""

    id: str
    prompt_ids: list[int]
    reference_ids: list[int]
    key: str = ""  # the item's key words, `|`-separated (see `is_right`)


def is_right(answer: str, key: str) -> bool:
    """Does `answer` contain one of `key`'s words, as a whole word (any case)? ("0" is not in "10".)"""
    return any(
        re.search(rf"(?<!\w){re.escape(k.strip())}(?!\w)", answer, re.IGNORECASE) for k in key.split("|")
    )


def load_items(split: str, path: Path = GENERAL_SET) -> list[Item]:
    """The items of one half of the general set, in file order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Item(**row) for row in rows if row["split"] == split]


def encode(items: list[Item], tokenizer: Any) -> list[Encoded]:
    """Token ids of each item, rendered as the server renders a one-message request."""
    renderer = ChatRenderer(tokenizer)
    end = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    return [
        Encoded(
            item.id,
            renderer.render([{"role": "user", "content": item.prompt}]).prompt_ids,
            list(tokenizer.encode(item.reference, add_special_tokens=False)) + end,
            item.key,
        )
        for item in items
    ]
