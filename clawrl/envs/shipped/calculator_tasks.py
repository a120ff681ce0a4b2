"""The calculator environment's tasks: arithmetic word problems from templates, each with a worked example.

A row (a TRL dataset row: `prompt` and other columns, which `CalculatorEnv.reset` receives):

    {"prompt": [<worked example: user, assistant calculate call, tool result, assistant submit
                 call, tool result>, {"role": "user", "content": "Ana buys 3 cards at 4 dollars
                 each. How many dollars does Ana pay in total?"}],
     "answer": 12, "template": "shop", "example": "speed", "id": "calculator-train-0-0007"}

Templates have one or two operations and small whole answers. The worked example solves
another problem the same way the model should (calculate with the arithmetic, then submit
the result): half of the rows get an example of the same kind of arithmetic as the question
(`same_kind`: multiplication for a multiplication, ...), the other half one of another kind.
That sets the difficulty: on the embedded SmolLM2-135M with the forced schedule
calculate,submit, greedy, an example of the same kind gave 14 of 18 problems right, one of
another kind 3 of 18, and no example none at all (it calls calculate with an empty or
made-up expression); the half-and-half mix is measured in docs/environments.md.

Splits (`tasks(split, seed)`): `train` uses six templates and 3 in 4 of their number
combinations; `held_out_numbers` the same templates with the combinations `train` never
uses; `held_out_templates` three templates `train` never uses; `held_out` both kinds,
alternating. The split of the numbers is a hash of the template and the numbers, the same
for every seed; worked examples always come from the train templates and train numbers.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawrl.envs.shipped.calculator import INSTRUCTION, evaluate, format_number

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jade", "Kofi", "Lena")
ITEMS = ("apple", "pencil", "marble", "sticker", "cookie", "card", "shell", "stamp")
SPLITS = ("train", "held_out", "held_out_numbers", "held_out_templates")
SIZES = {"train": 400, "held_out": 100, "held_out_numbers": 100, "held_out_templates": 100}
SAME_KIND = 0.5  # the share of rows whose worked example has the question's kind of arithmetic


@dataclass(frozen=True)
class Template:
    id: str
    kind: str  # the arithmetic: add, sub, mul, div, two_step
    text: str  # placeholders: {a} {b} {c} (numbers), {name}, {item}
    expression: str  # the arithmetic that answers it, e.g. "{a} * {b}"
    numbers: Callable[[random.Random], dict[str, int]]

    def answer(self, numbers: dict[str, int]) -> int:
        return int(evaluate(self.expression.format(**numbers)))


def _pick(**ranges: tuple[int, int]) -> Callable[[random.Random], dict[str, int]]:
    return lambda rng: {k: rng.randint(lo, hi) for k, (lo, hi) in ranges.items()}


def _share(rng: random.Random) -> dict[str, int]:
    b, k = rng.randint(2, 9), rng.randint(2, 12)
    return {"a": b * k, "b": b}


def _save(rng: random.Random) -> dict[str, int]:
    a, b = rng.randint(5, 20), rng.randint(2, 8)
    return {"a": a, "b": b, "c": rng.randint(1, a * b - 1)}


def _change(rng: random.Random) -> dict[str, int]:
    a, b = rng.randint(2, 15), rng.randint(2, 6)
    return {"a": a, "b": b, "c": a * b + rng.randint(1, 30)}


TRAIN_TEMPLATES = (
    Template(
        id="shop", kind="mul",
        text="{name} buys {a} {item}s at {b} dollars each. How many dollars does {name} pay in total?",
        expression="{a} * {b}", numbers=_pick(a=(2, 9), b=(2, 20)),
    ),
    Template(
        id="left", kind="sub",
        text="{name} has {a} {item}s and gives {b} of them away. How many {item}s does {name} have left?",
        expression="{a} - {b}", numbers=_pick(a=(20, 99), b=(2, 19)),
    ),
    Template(
        id="more", kind="add",
        text="A box holds {a} {item}s. {name} puts in {b} more. How many {item}s are in the box now?",
        expression="{a} + {b}", numbers=_pick(a=(10, 99), b=(10, 99)),
    ),
    Template(
        id="share", kind="div",
        text="{name} shares {a} {item}s equally among {b} friends. How many {item}s does each friend get?",
        expression="{a} / {b}", numbers=_share,
    ),
    Template(
        id="speed", kind="mul",
        text="A train travels at {a} km per hour for {b} hours. How many km does it travel?",
        expression="{a} * {b}", numbers=_pick(a=(20, 90), b=(2, 6)),
    ),
    Template(
        id="save", kind="two_step",
        text="{name} saves {a} dollars every week for {b} weeks, then spends {c} dollars. "
        "How many dollars are left?",
        expression="{a} * {b} - {c}", numbers=_save,
    ),
)  # fmt: skip
HELD_OUT_TEMPLATES = (
    Template(
        id="rows", kind="mul",
        text="A garden has {a} rows with {b} plants in each row. How many plants are in the garden?",
        expression="{a} * {b}", numbers=_pick(a=(2, 12), b=(3, 15)),
    ),
    Template(
        id="pages", kind="sub",
        text="A book has {a} pages. {name} has read {b} pages. How many pages are left to read?",
        expression="{a} - {b}", numbers=_pick(a=(50, 300), b=(5, 49)),
    ),
    Template(
        id="change", kind="two_step",
        text="Tickets cost {a} dollars each. {name} buys {b} tickets and pays with {c} dollars. "
        "How many dollars of change does {name} get?",
        expression="{c} - {a} * {b}", numbers=_change,
    ),
)  # fmt: skip


def held_out_numbers(template: str, numbers: dict[str, int]) -> bool:
    """Whether this combination of numbers is kept out of `train` (1 in 4, by a hash)."""
    key = template + ":" + ",".join(f"{k}={numbers[k]}" for k in sorted(numbers))
    return hashlib.sha256(key.encode()).digest()[0] % 4 == 0


def tasks(split: str = "train", seed: int = 0, count: int | None = None) -> list[dict[str, Any]]:
    """`count` distinct problems of `split` (default: 400 train, 100 for the held-out splits)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    rng = random.Random(f"calculator:{split}:{seed}")
    count = SIZES[split] if count is None else count
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < count:
        kind = split if split != "held_out" else SPLITS[2 + len(rows) % 2]
        row = problem(rng, kind)
        if row["prompt"][-1]["content"] not in seen:
            seen.add(row["prompt"][-1]["content"])
            rows.append({**row, "id": f"calculator-{split}-{seed}-{len(rows):04d}"})
    return rows


def problem(rng: random.Random, split: str) -> dict[str, Any]:
    """One row of `split` (train, held_out_numbers or held_out_templates), its worked example first."""
    template, numbers = _draw(
        rng, HELD_OUT_TEMPLATES if split == "held_out_templates" else TRAIN_TEMPLATES, split
    )
    question = {"role": "user", "content": _text(rng, template, numbers)}
    same = [t for t in TRAIN_TEMPLATES if t.kind == template.kind]
    other = [t for t in TRAIN_TEMPLATES if t.kind != template.kind]
    example = rng.choice(same if same and rng.random() < SAME_KIND else other)
    prompt = [*worked_example(rng, example), question]
    return {
        "prompt": prompt,
        "answer": template.answer(numbers),
        "template": template.id,
        "example": example.id,
    }


def _draw(rng: random.Random, templates: tuple[Template, ...], split: str) -> tuple[Template, dict[str, int]]:
    while True:
        template = rng.choice(templates)
        numbers = template.numbers(rng)
        if split == "held_out_templates" or held_out_numbers(template.id, numbers) == (split != "train"):
            return template, numbers


def _text(rng: random.Random, template: Template, numbers: dict[str, int]) -> str:
    return template.text.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), **numbers)


def worked_example(rng: random.Random, template: Template) -> list[dict[str, Any]]:
    """A solved problem of `template` (train numbers) as the conversation the model should have."""
    _, numbers = _draw(rng, (template,), "train")
    expression = template.expression.format(**numbers)
    result = format_number(evaluate(expression))
    return [
        {"role": "user", "content": _text(rng, template, numbers) + INSTRUCTION},
        _call("call_example_1", "calculate", {"expression": expression}),
        {"role": "tool", "tool_call_id": "call_example_1", "name": "calculate", "content": result},
        _call("call_example_2", "submit", {"answer": template.answer(numbers)}),
        {"role": "tool", "tool_call_id": "call_example_2", "name": "submit", "content": "Submitted."},
    ]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }
