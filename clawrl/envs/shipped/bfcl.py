"""The `bfcl` environment: one function call, checked against the Berkeley Function Calling Leaderboard.

Tasks are the leaderboard's `simple` (BFCL_v4_simple_python.json: one function offered)
and `multiple` (BFCL_v4_multiple.json: two to four offered, one right) categories, read
from the `bfcl-eval` wheel's data folder (scripts/setup installs it, without its
dependencies: nothing of it is imported), with their possible answers
(`possible_answer/`). A task row:

    {"prompt": [{"role": "user", "content": "Find the area of a triangle ..."}],
     "functions": [<BFCL function>, ...], "ground_truth": [{"calculate_triangle_area": {...}}],
     "id": "simple_python_0", "category": "simple"}

The tools are the task's functions, bound in `reset` (clawrl reads an environment's tools
after `reset`; TRL reads them before, so under TRL this environment offers none), each
with its BFCL schema in JSON Schema (`json_schema`, see clawrl/envs/shipped/bfcl_match.py). A call
is recorded, not run, and ends the episode (`done`); the reward is 1 when the episode made
exactly one call and it matches a possible answer (BFCL's AST check), else 0.

Split: `held_out` is the rows whose id hashes to 0 mod 5 (about 1 in 5), `train` the
rest; the same on every machine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import types
from pathlib import Path
from typing import Any

from clawrl.envs.shipped.bfcl_match import check_call, function_schema, tool_name

CATEGORIES = {"simple": "BFCL_v4_simple_python.json", "multiple": "BFCL_v4_multiple.json"}
SPLITS = ("train", "held_out")


def data_folder() -> Path:
    """The bfcl-eval wheel's data folder (found without importing the package)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the bfcl environment reads the bfcl-eval wheel's data: "
            "pip install --no-deps bfcl-eval==2026.3.23 (scripts/setup does)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def held_out(task_id: str) -> bool:
    return hashlib.sha256(task_id.encode()).digest()[0] % 5 == 0


def tasks(split: str = "train") -> list[dict[str, Any]]:
    """The rows of `split`, simple ones first, each category in the leaderboard's order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    rows = []
    for category, name in CATEGORIES.items():
        for row in read_category(data_folder(), name, category):
            if held_out(row["id"]) == (split == "held_out"):
                rows.append(row)
    return rows


def read_category(folder: Path, name: str, category: str) -> list[dict[str, Any]]:
    """One category's questions joined with their possible answers, as task rows."""
    answers = {a["id"]: a["ground_truth"] for a in _lines(folder / "possible_answer" / name)}
    return [
        {
            "prompt": q["question"][0],
            "functions": q["function"],
            "ground_truth": answers[q["id"]],
            "id": q["id"],
            "category": category,
        }
        for q in _lines(folder / name)
    ]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class BfclEnv:
    """A BFCL question: call the right function with the right arguments, once."""

    def __init__(self) -> None:
        self.functions: list[dict[str, Any]] = []
        self.ground_truth: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.done = False
        self._bound: list[str] = []

    def reset(self, functions: list[dict[str, Any]], ground_truth: list[dict[str, Any]], **task: Any) -> None:
        for name in self._bound:  # an instance reused for another task (TRL pools them)
            delattr(self, name)
        self.functions, self.ground_truth, self.calls, self.done = functions, ground_truth, [], False
        self._bound = []
        for function in functions:
            name = tool_name(function["name"])
            if hasattr(self, name):
                raise ValueError(
                    f"the task's function {function['name']!r} clashes with the environment's {name}"
                )
            setattr(self, name, types.MethodType(_recorder(function), self))
            self._bound.append(name)

    def get_reward(self) -> float:
        if len(self.calls) != 1:
            return 0.0
        name, arguments = self.calls[0]
        function = next((f for f in self.functions if tool_name(f["name"]) == name), None)
        if function is None:
            return 0.0
        return (
            1.0 if any(check_call(name, arguments, function, e) is None for e in self.ground_truth) else 0.0
        )


def _recorder(function: dict[str, Any]) -> Any:
    """A tool function that records its call; the schema rides along as `json_schema`."""
    name = tool_name(function["name"])

    def record(self: BfclEnv, **arguments: Any) -> str:
        self.calls.append((name, arguments))
        self.done = True
        return "The call was recorded."

    record.__name__ = record.__qualname__ = name
    record.__doc__ = function.get("description") or name
    record.json_schema = function_schema(function)  # type: ignore[attr-defined]
    return record
