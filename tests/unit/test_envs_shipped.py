"""The shipped environments' pure parts: calculator problems, its safe evaluator and answer check;
bfcl's schemas and call matching against real rows of the leaderboard's data."""

from __future__ import annotations

import functools
import json
import re

import pytest

from clawrl.envs.shipped import bfcl, calculator, calculator_tasks
from clawrl.envs.shipped.bfcl_match import check_call, check_value, function_schema, standard, tool_name
from clawrl.envs.shipped.calculator import CalculatorEnv, evaluate, format_number, is_right, parse_number
from clawrl.envs.tools import find_tools


def _numbers(message):
    """The numbers of a problem's text, in order: {a}, {b}, {c} in every template."""
    return dict(zip("abc", map(int, re.findall(r"\d+", message["content"])), strict=False))


def test_calculator_splits_are_deterministic_and_keep_held_out_numbers_and_templates_apart():
    train = calculator_tasks.tasks("train", seed=0)
    assert train == calculator_tasks.tasks("train", seed=0) and train != calculator_tasks.tasks(
        "train", seed=1
    )
    assert len(train) == 400 and len({r["id"] for r in train}) == 400
    numbers = calculator_tasks.tasks("held_out_numbers", seed=0)
    templates = calculator_tasks.tasks("held_out_templates", seed=0)
    train_templates = {t.id for t in calculator_tasks.TRAIN_TEMPLATES}
    assert {r["template"] for r in train} == train_templates
    assert {r["template"] for r in numbers} <= train_templates
    assert {r["template"] for r in templates} == {t.id for t in calculator_tasks.HELD_OUT_TEMPLATES}
    # a held-out combination of numbers is in no train prompt (question or worked example), whatever the seed
    assert all(calculator_tasks.held_out_numbers(r["template"], _numbers(r["prompt"][-1])) for r in numbers)
    for r in (r for seed in range(3) for r in calculator_tasks.tasks("train", seed=seed)):
        assert not calculator_tasks.held_out_numbers(r["template"], _numbers(r["prompt"][-1]))
        assert not calculator_tasks.held_out_numbers(r["example"], _numbers(r["prompt"][0]))
    mixed = calculator_tasks.tasks("held_out", seed=0, count=10)
    assert [r["template"] in train_templates for r in mixed] == [True, False] * 5
    # worked examples always come from the train templates; about half share the question's kind
    assert {r["example"] for r in templates} <= train_templates
    kinds = {t.id: t.kind for t in calculator_tasks.TRAIN_TEMPLATES + calculator_tasks.HELD_OUT_TEMPLATES}
    same = sum(kinds[r["template"]] == kinds[r["example"]] for r in train) / len(train)
    assert 0.4 < same < 0.6
    with pytest.raises(ValueError, match="unknown split"):
        calculator_tasks.tasks("test")


def test_the_worked_example_is_the_conversation_the_env_would_have():
    (row,) = calculator_tasks.tasks("train", seed=5, count=1)
    ask, calculate, result, submit, submitted, question = row["prompt"]
    assert ask["content"].endswith(calculator.INSTRUCTION) and question["role"] == "user"
    env = CalculatorEnv()
    env.reset(answer=json.loads(submit["tool_calls"][0]["function"]["arguments"])["answer"])
    expression = json.loads(calculate["tool_calls"][0]["function"]["arguments"])["expression"]
    assert env.calculate(expression) == result["content"] and result["tool_call_id"] == "call_example_1"
    assert env.submit(float(result["content"])) == submitted["content"] and env.get_reward() == 1.0


def test_every_calculator_answer_is_a_whole_number_the_evaluator_agrees_with():
    for split in calculator_tasks.SPLITS:
        for row in calculator_tasks.tasks(split, seed=3, count=60):
            assert isinstance(row["answer"], int) and row["answer"] >= 0, row
            assert row["prompt"][-1]["role"] == "user" and "{" not in row["prompt"][-1]["content"]
    row = {"prompt": "A train travels at 40 km per hour for 3 hours.", "answer": 120}
    env = CalculatorEnv()
    assert env.reset(**row) == calculator.INSTRUCTION
    assert env.calculate("40 * 3") == "120" and env.get_reward() == 0.0 and not env.done
    env.submit(120.0)
    assert env.done and env.get_reward() == 1.0
    env.reset(**row)
    env.submit("$119")
    assert env.get_reward() == 0.0


@pytest.mark.parametrize(
    ("text", "value"),
    [("12 * (3 + 4)", 84), ("3 x 4", 12), ("3×4 =", 12), ("1,200 / 3", 400), ("2^3", 8), ("-5 + 2", -3),
     ("7 // 2", 3), ("7 % 4", 3), ("0.1 + 0.2", 0.30000000000000004), ("$5 * 3", 15)],
)  # fmt: skip
def test_the_evaluator_does_arithmetic(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("(1).__class__", "only numbers"),
        ("x + 1", "only numbers"),
        ("2 ** 99", "exponents above 12"),
        ("9 ** 12 ** 2", "exponents above 12"),
        ("1 / 0", "division by zero"),
        ("1e300 * 1e300", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("", "1 to 200 characters"),
        ("1+" * 150 + "1", "1 to 200 characters"),
        ("True + 1", "only numbers"),
    ],
)
def test_the_evaluator_refuses_anything_but_arithmetic(text, message):
    with pytest.raises(ValueError, match=message):
        evaluate(text)


def test_answers_are_checked_as_numbers():
    assert (
        is_right(12.0, 12) and is_right(12.0000001, 12) and not is_right(12.01, 12) and not is_right(None, 12)
    )
    assert parse_number("1,200") == 1200 and parse_number(" $7 ") == 7 and parse_number(3) == 3.0
    for bad in ("twelve", True, float("nan"), [12]):
        with pytest.raises(ValueError):
            parse_number(bad)
    assert format_number(12.0) == "12" and format_number(2 / 3) == "0.6666666667"


@functools.cache
def rows_by_id() -> dict[str, dict]:  # read once: the tests only read the rows
    return {r["id"]: r for split in bfcl.SPLITS for r in bfcl.tasks(split)}


def test_bfcl_rows_split_deterministically_and_carry_their_answers():
    train, held = bfcl.tasks("train"), bfcl.tasks("held_out")
    assert len(train) + len(held) == 600 and 90 <= len(held) <= 150
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert {r["category"] for r in held} == {"simple", "multiple"}
    first = rows_by_id()["simple_python_0"]
    assert first["prompt"] == [
        {
            "role": "user",
            "content": "Find the area of a triangle with a base of 10 units and height of 5 units.",
        }
    ]
    assert first["ground_truth"] == [
        {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}
    ]


def test_bfcl_schemas_are_json_schema():
    rows = rows_by_id()
    schema = function_schema(rows["multiple_0"]["functions"][1])
    assert schema["name"] == "circle_properties_get"  # "." is not allowed in an OpenAI function name
    radius = schema["parameters"]["properties"]["radius"]
    assert radius["type"] == "number" and "optional" not in schema["parameters"]["properties"]["get_area"]
    assert schema["parameters"]["additionalProperties"] is False
    every = [function_schema(f) for r in rows.values() for f in r["functions"]]
    kinds = {p["type"] for s in every for p in s["parameters"]["properties"].values()}
    assert kinds <= {"integer", "number", "string", "boolean", "array", "object"}


@pytest.mark.parametrize(
    ("task", "name", "arguments", "reason"),
    [
        ("simple_python_0", "calculate_triangle_area", {"base": 10, "height": 5}, None),
        ("simple_python_0", "calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"}, None),
        (
            "simple_python_0",
            "calculate_triangle_area",
            {"base": 10, "height": 6},
            "'height': 6 is not a possible",
        ),
        ("simple_python_0", "calculate_triangle_area", {"base": 10}, "missing required parameter 'height'"),
        (
            "simple_python_0",
            "calculate_triangle_area",
            {"base": 10, "height": 5, "color": "red"},
            "unexpected",
        ),
        ("simple_python_0", "calculate_triangle_area", {"base": "10", "height": 5}, "expected integer"),
        ("simple_python_0", "triangle_area", {"base": 10, "height": 5}, "called triangle_area"),
        ("simple_python_1", "math_factorial", {"number": 5}, None),
        ("multiple_0", "triangle_properties_get", {"side1": 5, "side2": 4, "side3": 3}, None),
        (
            "multiple_0",
            "triangle_properties_get",
            {"side1": 5, "side2": 4, "side3": 3, "get_area": True},
            None,
        ),
        ("multiple_0", "circle_properties_get", {"radius": 5}, "called circle_properties_get"),
    ],
)
def test_bfcl_calls_are_checked_like_the_leaderboard(task, name, arguments, reason):
    row = rows_by_id()[task]
    (want,) = row["ground_truth"]
    function = next(f for f in row["functions"] if tool_name(f["name"]) == name) if reason is None else None
    function = function or next(
        f for f in row["functions"] if tool_name(f["name"]) == tool_name(next(iter(want)))
    )
    got = check_call(name, arguments, function, want)
    assert (got is None) if reason is None else (reason in (got or "")), got


def test_bfcl_values_follow_its_comparison_rules():
    assert standard("April 1, 2024") == standard("april 1 2024") == "april12024"
    assert check_value("p", 3, {"type": "float"}, [3.0]) is None  # an int counts for a float
    assert check_value("p", ["New York", "LA"], {"type": "array"}, [["new york", "la"]]) is None
    assert check_value("p", {"a": "X"}, {"type": "dict"}, [{"a": ["x"], "b": ["", 1]}]) is None
    assert check_value("p", {"a": "X"}, {"type": "dict"}, [{"a": ["x"], "b": [1]}]) is not None
    assert check_value("p", "anything", {"type": "any"}, ["Anything"]) is None
    assert check_value("p", True, {"type": "integer"}, [1]) is not None  # a bool is not an integer


def test_the_bfcl_env_offers_each_task_its_functions_and_rewards_one_right_call():
    import asyncio

    rows = rows_by_id()
    env = bfcl.BfclEnv()
    env.reset(**rows["multiple_0"])
    tools = find_tools(env)
    assert sorted(tools.names) == ["circle_properties_get", "triangle_properties_get"]
    right = {"side1": 5, "side2": 4, "side3": 3}
    assert (
        asyncio.run(tools.call("triangle_properties_get", json.dumps(right), 5)).content
        == "The call was recorded."
    )
    assert env.done and env.get_reward() == 1.0
    env.reset(**rows["simple_python_1"])  # the instance reused for another task: the old tools are gone
    assert find_tools(env).names == ["math_factorial"] and not env.done and env.get_reward() == 0.0
    env.math_factorial(number=5)
    env.math_factorial(number=5)
    assert env.get_reward() == 0.0  # BFCL's simple category wants exactly one call


def _gold(value):
    """The first possible value, unwrapped through dicts (whose values are lists of possible values too)."""
    if isinstance(value, dict):
        return {k: _gold(v[0]) for k, v in value.items() if v and v[0] != ""}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_gold(v) for v in value]
    return value


def test_every_bfcl_rows_own_answer_passes_the_check():
    failing = []
    for row in rows_by_id().values():
        ((name, params),) = row["ground_truth"][0].items()
        arguments = {k: _gold(v[0]) for k, v in params.items() if v and v[0] != ""}
        function = next(f for f in row["functions"] if f["name"] == name)
        reason = check_call(tool_name(name), arguments, function, row["ground_truth"][0])
        if reason is not None:
            failing.append((row["id"], reason))
    # the one row whose possible answer leaves out a parameter its function requires (BFCL fails it too)
    assert failing == [("simple_python_200", "missing required parameter 'fuel_efficiency'")]


def test_the_calculate_schema_clawrl_offers_is_the_one_trl_builds_plus_the_length_limit():
    from transformers.utils import get_json_schema

    built = get_json_schema(CalculatorEnv.calculate)["function"]
    given = CalculatorEnv.calculate.json_schema
    assert given["name"] == built["name"] and given["description"] == built["description"]
    expression = dict(given["parameters"]["properties"]["expression"])
    assert expression.pop("maxLength") == calculator.MAX_LENGTH
    assert expression == built["parameters"]["properties"]["expression"]
    assert given["parameters"]["required"] == built["parameters"]["required"]
