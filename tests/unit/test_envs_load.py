"""Loading environments (FILE.py:Class, module:Class, shipped names), their tools' schemas, the
tool-choice schedule and the tasks file: what a user can get wrong gives one clear message."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time

import pytest

from clawrl.envs.errors import EnvLoadError, TaskError
from clawrl.envs.load import load_env, load_reward, probe, read_tasks, task_id
from clawrl.envs.schedule import Schedule, parse_schedule
from clawrl.envs.tools import ToolSchemaError, find_tools

# An environment exactly as one is written for TRL's GRPOTrainer(environment_factory=...): it
# imports nothing from clawrl.
TRL_ENV = '''
class CounterEnv:
    def __init__(self):
        self.counter = 0
        self.target = None

    def reset(self, target, **kwargs):
        self.counter = 0
        self.target = target
        return " Start at 0."

    def increment(self, step: int) -> int:
        """
        Increment the counter by a given step.

        Args:
            step: How much to add.

        Returns:
            The counter after the increment.
        """
        self.counter += step
        return self.counter

    async def peek(self, label: str = "now") -> str:
        """
        Read the counter.

        Args:
            label: A label to print with it.
        """
        return f"{label}: {self.counter}"

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else 0.0

    def _helper(self):
        return "not a tool"
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "counter_env.py"
    path.write_text(TRL_ENV)
    return path


def test_a_trl_env_from_a_file_has_its_public_methods_as_tools(env_file):
    spec = load_env(f"{env_file}:CounterEnv")
    assert spec.name == "counter_env:CounterEnv" and spec.shipped is None
    assert sorted(probe(spec, has_reward_function=False)) == ["increment", "peek"]
    tools = find_tools(spec.factory())
    by_name = {s["function"]["name"]: s["function"] for s in tools.schemas}
    assert by_name["increment"] == {
        "name": "increment",
        "description": "Increment the counter by a given step.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer", "description": "How much to add."}},
            "required": ["step"],
            "additionalProperties": False,
        },
    }
    assert by_name["peek"]["parameters"]["properties"]["label"]["type"] == "string"
    assert "required" not in by_name["peek"]["parameters"]  # it has a default


def test_a_module_class_and_the_shipped_names_load():
    spec = load_env("clawrl.envs.shipped.calculator:CalculatorEnv")
    assert spec.name == "clawrl.envs.shipped.calculator:CalculatorEnv"
    calculator = load_env("calculator")
    assert calculator.shipped is not None and calculator.shipped.tool_choice == "calculate,submit"
    assert sorted(probe(calculator, False)) == ["calculate", "submit"]
    assert probe(load_env("bfcl"), False) == []  # its tools come with each task, in reset


@pytest.mark.parametrize(
    ("source", "spec", "message"),
    [
        (None, "missing.py:Env", "environment: no file missing.py"),
        (
            "raise RuntimeError('boom at import')\n",
            "{f}:Env",
            "importing {f} failed: RuntimeError: boom at import",
        ),
        ("x = 1\n", "{f}:Env", "has no 'Env'"),
        ("import not_a_module_anywhere\n", "{f}:Env", "ModuleNotFoundError"),
        ("def broken(:\n", "{f}:Env", "SyntaxError"),
        (None, "no_such_package.envs:Env", "no module named 'no_such_package.envs'"),
        (None, "calculator_but_typo", "expected FILE.py:Name or module:Name"),
        ("Env = 3\n", "{f}:Env", "int is not a class"),
    ],
)
def test_an_environment_that_does_not_import_is_one_clear_error(tmp_path, source, spec, message):
    path = tmp_path / "bad_env.py"
    if source is not None:
        path.write_text(source)
    spec = spec.format(f=path)
    with pytest.raises(EnvLoadError) as caught:
        load_env(spec)
    assert message.format(f=path) in str(caught.value)


def test_an_environment_that_cannot_be_built_or_lacks_the_contract_is_refused(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(
        textwrap.dedent("""
        class Crashes:
            def __init__(self):
                raise ValueError("no GPU here")
        class NoReset:
            def get_reward(self):
                return 1.0
        class NoReward:
            def reset(self, **row):
                return None
        class NoDocstring:
            def reset(self, **row):
                return None
            def get_reward(self):
                return 0.0
            def act(self, x: int) -> int:
                return x
        """)
    )
    cases = {
        "Crashes": "cannot construct environment envs:Crashes: ValueError: no GPU here",
        "NoReset": "has no reset method",
        "NoReward": "has no get_reward method: give a reward function with --reward",
        "NoDocstring": "tool 'act'",
    }
    for name, message in cases.items():
        with pytest.raises(EnvLoadError) as caught:
            probe(load_env(f"{path}:{name}"), has_reward_function=False)
        assert message in str(caught.value), name
    probe(load_env(f"{path}:NoReward"), has_reward_function=True)  # a reward function makes it whole


def test_a_reward_function_loads_from_a_file(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text("def score(prompts, completions, **kwargs):\n    return [0.5 for _ in completions]\n")
    assert load_reward(f"{path}:score")(prompts=[[]], completions=[[]]) == [0.5]
    with pytest.raises(EnvLoadError, match="has no 'nope'"):
        load_reward(f"{path}:nope")


def test_tool_calls_run_sync_and_async_and_report_errors(env_file):
    env = load_env(f"{env_file}:CounterEnv").factory()
    env.reset(target=3)
    tools = find_tools(env)

    async def calls():
        return [
            await tools.call("increment", '{"step": 2}', 5),
            await tools.call("peek", {"label": "x"}, 5),
            await tools.call("increment", '{"step": 1, "extra": 1}', 5),
            await tools.call("increment", "[1]", 5),
            await tools.call("increment", "{not json", 5),
            await tools.call("fly", "{}", 5),
        ]

    ok, peeked, extra, not_object, bad_json, unknown = asyncio.run(calls())
    assert (ok.content, ok.error) == ("2", False) and peeked.content == "x: 2"
    assert extra.error and "unexpected keyword argument 'extra'" in json.loads(extra.content)["error"]
    assert json.loads(not_object.content) == {"error": "the arguments must be a JSON object, got list"}
    assert json.loads(bad_json.content)["error"].startswith("the arguments are not JSON")
    assert json.loads(unknown.content)["error"] == "unknown tool 'fly'; the tools are: increment, peek"
    assert env.counter == 2


def test_a_hung_tool_is_left_behind_at_its_timeout():
    class Slow:
        def __init__(self):
            self.release = __import__("threading").Event()

        def wait(self) -> str:
            """Block until released.

            Args:
            """
            self.release.wait(30)
            return "late"

        async def sleep(self) -> str:
            """Sleep.

            Args:
            """
            await asyncio.sleep(30)
            return "late"

    env = Slow()
    tools = find_tools(env)

    async def calls():
        started = time.monotonic()
        sync = await tools.call("wait", "{}", 0.2)
        async_ = await tools.call("sleep", "{}", 0.2)
        return sync, async_, time.monotonic() - started

    sync, async_, took = asyncio.run(calls())
    env.release.set()  # the thread the sync tool ran in finishes now, its result unused
    assert json.loads(sync.content) == {"error": "the tool wait did not return within 0.2 s"}
    assert json.loads(async_.content) == {"error": "the tool sleep did not return within 0.2 s"}
    assert took < 5


def test_a_given_json_schema_is_used_as_it_is():
    def lookup(**arguments):
        return arguments

    lookup.json_schema = {"name": "lookup", "description": "d", "parameters": {"type": "object"}}

    class Env:
        def __init__(self):
            self.lookup = lookup.__get__(self)

    assert find_tools(Env()).schemas == [{"type": "function", "function": lookup.json_schema}]


def test_a_tool_without_type_hints_has_no_schema():
    class Env:
        def act(self, x):
            """Act.

            Args:
                x: what
            """

    with pytest.raises(ToolSchemaError, match="tool 'act'"):
        find_tools(Env())


def test_the_schedule_repeats_its_last_value():
    schedule = parse_schedule("calculate, submit")
    assert schedule == Schedule(("calculate", "submit"))
    assert [schedule.at(t) for t in range(4)] == ["calculate", "submit", "submit", "submit"]
    assert schedule.tool_choice(0) == {"type": "function", "function": {"name": "calculate"}}
    assert parse_schedule("required,auto").tool_choice(5) == "auto"
    assert parse_schedule("none").tool_choice(0) == "none"
    assert schedule.unknown(["calculate"]) == ["submit"] and schedule.named() == {"calculate", "submit"}
    assert str(schedule) == "calculate,submit"
    for bad in ("", "auto,,submit", "call me"):
        with pytest.raises(ValueError, match="--tool-choice"):
            parse_schedule(bad)


def test_tasks_are_read_from_jsonl_with_the_bad_line_named(tmp_path):
    good = tmp_path / "tasks.jsonl"
    good.write_text(
        '{"prompt": "Add 2", "target": 2}\n\n{"prompt": [{"role": "user", "content": "x"}], "id": 7}\n'
    )
    rows = read_tasks(good)
    assert [task_id(r, i) for i, r in enumerate(rows)] == ["row-0", "7"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"question": "no prompt"}\n')
    with pytest.raises(TaskError, match=r"bad.jsonl:2: a task is a JSON object with a \"prompt\""):
        read_tasks(bad)
    bad.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(TaskError, match=r"bad.jsonl:2: not JSON"):
        read_tasks(bad)
    with pytest.raises(TaskError, match="cannot read the tasks file"):
        read_tasks(tmp_path / "missing.jsonl")
