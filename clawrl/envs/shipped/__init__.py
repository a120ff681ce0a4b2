"""The environments clawrl ships, apart from the episode runner that runs any environment.

    name          --env               what it is
    calculator    calculator          arithmetic word problems with `calculate` and `submit` tools
                                      (calculator.py: TRL's contract, imports nothing from clawrl;
                                      calculator_tasks.py: the problems, worked examples, splits)
    bfcl          bfcl                function calling on the Berkeley Function Calling
                                      Leaderboard's data (the `bfcl-eval` wheel; bfcl.py, and
                                      bfcl_match.py: its schemas and call checking, pure)
    terminal      harbor:terminal     Harbor task folders: shell tasks in a bubblewrap sandbox
    repository    harbor:repository   Harbor task folders: fix a small repository until its tests pass
                                      (harbor_sets/; `clawrl/envs/harbor` runs any Harbor folder)

`SHIPPED` is the list `--env NAME` looks in; `HARBOR_SETS` the folder `harbor:NAME` does.
Adding one: docs/design.md, "Adding an environment".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shipped:
    """A shipped environment: its class, its task generator `(split, seed) -> rows`, its defaults."""

    env: str  # "module:Class"
    tasks: str  # "module:function"
    tool_choice: str  # the default --tool-choice
    max_turns: int  # the default --max-turns
    splits: tuple[str, ...]


SHIPPED: dict[str, Shipped] = {
    "calculator": Shipped(
        env="clawrl.envs.shipped.calculator:CalculatorEnv",
        tasks="clawrl.envs.shipped.calculator_tasks:tasks",
        tool_choice="calculate,submit",
        max_turns=4,
        splits=("train", "held_out", "held_out_numbers", "held_out_templates"),
    ),
    "bfcl": Shipped(
        env="clawrl.envs.shipped.bfcl:BfclEnv",
        tasks="clawrl.envs.shipped.bfcl:tasks",
        tool_choice="required",
        max_turns=2,
        splits=("train", "held_out"),
    ),
}


HARBOR_SETS = Path(__file__).with_name("harbor_sets")  # harbor:terminal names a set in it
