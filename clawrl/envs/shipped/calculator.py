"""The `calculator` environment: an arithmetic word problem, a calculator tool, a submit tool.

Written in TRL's `environment_factory` contract and importing nothing from clawrl, so the
same class trains under TRL's GRPOTrainer:

    from clawrl.envs.shipped.calculator import CalculatorEnv
    from clawrl.envs.shipped.calculator_tasks import tasks
    GRPOTrainer(..., train_dataset=Dataset.from_list(tasks("train")), environment_factory=CalculatorEnv)

A task row has the problem in `prompt` and the number in `answer` (the problems and their
splits: clawrl/envs/shipped/calculator_tasks.py). `reset` appends the instruction to use the tools;
the tools are `calculate(expression)` (a safe evaluator: numbers, + - * / // % **,
parentheses; never Python's eval) and `submit(answer)`, which ends the episode
(`self.done = True`, clawrl's addition; TRL ignores it). The reward is 1 when the
submitted number is the answer (relative tolerance 1e-6), else 0.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

INSTRUCTION = " Use the calculate tool to work out the answer, then call submit with the number."


class CalculatorEnv:
    """An arithmetic word problem: work it out with `calculate`, then `submit` the answer."""

    def __init__(self) -> None:
        self.answer: float | None = None
        self.submitted: float | None = None
        self.done = False

    def reset(self, answer: float, **task: Any) -> str:
        self.answer, self.submitted, self.done = float(answer), None, False
        return INSTRUCTION

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: The arithmetic to do: numbers with + - * / and parentheses.
        """
        return format_number(evaluate(expression))

    # The schema clawrl offers (TRL builds its own from the docstring and ignores this): the same,
    # plus the evaluator's length limit, so a forced call's grammar ends the string in time.
    calculate.json_schema = {  # type: ignore[attr-defined]
        "name": "calculate",
        "description": "Evaluate an arithmetic expression and return its value.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The arithmetic to do: numbers with + - * / and parentheses.",
                    "maxLength": 200,
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    }

    def submit(self, answer: float) -> str:
        """Submit the final answer to the problem. This ends the task.

        Args:
            answer: The final answer, a number.
        """
        self.submitted = parse_number(answer)
        self.done = True
        return "Submitted."

    def get_reward(self) -> float:
        return 1.0 if self.answer is not None and is_right(self.submitted, self.answer) else 0.0


def is_right(submitted: float | None, answer: float) -> bool:
    """Whether `submitted` is `answer` (relative tolerance 1e-6)."""
    return submitted is not None and abs(submitted - answer) <= 1e-6 * max(1.0, abs(answer))


def parse_number(value: Any) -> float:
    """A submitted answer as a number: a number, or a string such as "24", "$1,200" or "24.0"."""
    if isinstance(value, bool):
        raise ValueError("the answer must be a number, not true or false")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(",", "").lstrip("$").strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"the answer must be a number, got {value!r}") from None
    else:
        raise ValueError(f"the answer must be a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise ValueError("the answer must be a finite number")
    return number


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_LENGTH, MAX_EXPONENT, MAX_MAGNITUDE = 200, 12, 1e15  # MAX_LENGTH: also calculate.json_schema's


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression, parsed (never run): ValueError for anything else."""
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be a string, got {type(expression).__name__}")
    text = _normalise(expression)
    if not text or len(text) > MAX_LENGTH:
        raise ValueError(f"the expression must be 1 to {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _value(tree.body)
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError("the result is too large")
    return float(value)


def _normalise(expression: str) -> str:
    text = expression.split("=")[0]  # "25 + 1 = 26": the left side is the question
    text = text.strip().rstrip("?. ").replace("×", "*").replace("÷", "/").replace("^", "**")
    text = re.sub(r"(?<=\d)\s*[xX]\s*(?=[\d(])", "*", text)  # "3 x 4"
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text).replace("$", "")  # "1,200" and "$5"


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return float(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents above {MAX_EXPONENT} are not supported")
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise ValueError("division by zero")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise ValueError("the result is too large or not a real number")
        return float(result)
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}")


def format_number(value: float) -> str:
    """12.0 -> "12", 0.1 + 0.2 -> "0.3": whole numbers without a point, others to 10 significant digits."""
    if value == int(value):
        return str(int(value))
    return f"{value:.10g}"
