"""The episode runner and the group runner against a scripted server (a hand-written `Chat` with
the real interface): turns, tool messages, the schedule, how episodes end, and bad input that drops
an episode without stopping the run."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from typing import Any

import pytest

from clawrl.envs.episode import ContextFull, EpisodeSettings, Refused, Reply, run_episode
from clawrl.envs.groups import Runner, Task, groups_at_once, run_all
from clawrl.envs.load import EnvSpec
from clawrl.envs.schedule import parse_schedule
from clawrl.envs.shipped.calculator import CalculatorEnv

ROW = {"prompt": [{"role": "user", "content": "Ana buys 3 cards at 4 dollars each. How much?"}], "answer": 12}


def call(name: str, arguments: Any, n: int = 0) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{name}_{n}", "type": "function", "function": {"name": name, "arguments": args}}


class ScriptedChat:
    """Answers each request with the next scripted reply (a list of calls, a text, or an exception)."""

    def __init__(self, *script: Any, tokens: int = 10, version: str = "v0") -> None:
        self.script, self.tokens, self.version = list(script), tokens, version
        self.requests: list[dict[str, Any]] = []

    async def complete(self, messages, tools, tool_choice, *, session_id, max_tokens, temperature) -> Reply:
        self.requests.append(
            {"messages": [dict(m) for m in messages], "tools": tools, "tool_choice": tool_choice,
             "session_id": session_id, "max_tokens": max_tokens, "temperature": temperature}
        )  # fmt: skip
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, str):
            return Reply({"role": "assistant", "content": step}, "stop", self.tokens, self.version)
        finish = "tool_calls"
        return Reply(
            {"role": "assistant", "content": None, "tool_calls": step}, finish, self.tokens, self.version
        )


def run(chat, factory=CalculatorEnv, row=ROW, reward_fn=None, **settings):
    settings.setdefault("schedule", parse_schedule("calculate,submit"))
    return asyncio.run(
        run_episode(chat, factory, row, "t1", "sess-1", EpisodeSettings(**settings), reward_fn)
    )


def test_a_right_answer_through_both_tools_is_rewarded_1():
    chat = ScriptedChat([call("calculate", {"expression": "3 * 4"})], [call("submit", {"answer": 12})])
    result = run(chat, max_tokens=100, temperature=0.7)
    assert (result.reward, result.reason, result.turns, result.tool_calls, result.tool_errors) == (
        1.0,
        "done",
        2,
        2,
        0,
    )
    first, second = chat.requests
    # reset()'s string is appended to the prompt's last user message, as TRL does
    assert first["messages"] == [
        {"role": "user", "content": ROW["prompt"][0]["content"] + CalculatorEnv().reset(1)}
    ]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "calculate"}}
    assert second["tool_choice"] == {"type": "function", "function": {"name": "submit"}}
    assert {t["function"]["name"] for t in first["tools"]} == {"calculate", "submit"}
    assert first["session_id"] == second["session_id"] == "sess-1"
    assert (first["max_tokens"], second["max_tokens"], first["temperature"]) == (100, 90, 0.7)
    # the tool's result answers its call as a `tool` message, which the next request carries
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_calculate_0",
        "name": "calculate",
        "content": "12",
    }
    assert result.messages[-1]["content"] == "Submitted." and result.version == "v0" and result.tokens == 20


def test_a_tool_that_raises_gives_an_error_message_and_the_episode_goes_on():
    chat = ScriptedChat(
        [call("calculate", {"expression": "import os"})],
        [call("calculate", {"expression": "3*4"})],
        [call("submit", {"answer": "12"})],
    )
    result = run(chat, schedule=parse_schedule("calculate,calculate,submit"))
    error = json.loads(chat.requests[1]["messages"][-1]["content"])
    assert error == {"error": "not an arithmetic expression: 'import os'"}
    assert (result.reward, result.reason, result.tool_errors, result.turns) == (1.0, "done", 1, 3)


def test_an_answer_without_a_tool_call_ends_the_episode_and_is_scored():
    result = run(ScriptedChat("It is 12."), schedule=parse_schedule("auto"))
    assert (result.reward, result.reason, result.turns, result.tool_calls) == (0.0, "answered", 1, 0)


def test_the_turn_and_token_limits_end_with_reward_0():
    calc = [call("calculate", {"expression": "1+1"})]
    turns = run(ScriptedChat(calc, calc, calc), max_turns=2, schedule=parse_schedule("calculate"))
    assert (turns.reward, turns.reason, turns.turns) == (0.0, "turn_limit", 2)
    tokens = run(ScriptedChat(calc, calc, tokens=60), max_tokens=100, schedule=parse_schedule("calculate"))
    assert (tokens.reward, tokens.reason, tokens.turns) == (0.0, "token_limit", 2)
    cut = ScriptedChat("twelve and then some more words", tokens=5)
    cut.script = []

    async def length(*a, **k):
        return Reply({"role": "assistant", "content": "twelve and"}, "length", 100, "v0")

    cut.complete = length
    assert run(cut, schedule=parse_schedule("auto")).reason == "token_limit"
    full = run(ScriptedChat(calc, ContextFull("too long")), schedule=parse_schedule("calculate"))
    assert (full.reward, full.reason, full.turns) == (0.0, "token_limit", 1)


class WeirdReward(CalculatorEnv):
    def get_reward(self) -> float:
        return math.nan


class NeedsLevel:
    def reset(self, level: int) -> None:
        raise AssertionError("never called: the row has no level column")

    def get_reward(self) -> float:
        return 1.0


class HangingReset(CalculatorEnv):
    def reset(self, **row: Any) -> None:
        threading.Event().wait(30)


@pytest.mark.parametrize(
    ("factory", "script", "reason"),
    [
        (WeirdReward, ["no call"], "get_reward() is not a finite number: nan"),
        (NeedsLevel, [], "the task row does not fit reset(): "),
        (HangingReset, [], "reset() took over 0.3 s"),
        (
            CalculatorEnv,
            [Refused("http 400: bad messages")],
            "the server refused an answer: http 400: bad messages",
        ),
    ],
)
def test_bad_input_drops_the_episode_with_its_reason(factory, script, reason):
    chat = ScriptedChat(*script)
    result = run(chat, factory=factory, schedule=parse_schedule("auto"), tool_timeout_s=0.3)
    assert result.reward is None and result.dropped and result.reason.startswith(reason), result.reason
    if factory in (NeedsLevel, HangingReset):
        assert chat.requests == [] and result.turns == 0  # nothing was asked of the server


def test_a_schedule_naming_a_tool_the_task_lacks_drops_the_episode():
    chat = ScriptedChat()
    result = run(chat, schedule=parse_schedule("calculate,answer"))
    assert (
        result.reward is None
        and result.reason == "--tool-choice names answer, which this task does not offer"
    )
    assert chat.requests == []

    class NoTools:
        def reset(self, **row):
            return None

        def get_reward(self) -> float:
            return 1.0

    required = run(chat, factory=NoTools, schedule=parse_schedule("required"))
    assert required.reward is None
    assert required.reason == "--tool-choice required, but the environment offers no tools"
    free = run(ScriptedChat("42"), factory=NoTools, schedule=parse_schedule("auto"))
    assert (free.reward, free.reason) == (1.0, "answered")


def test_a_trl_reward_function_gets_the_batch_of_one_and_adds_to_get_reward():
    seen = {}

    def reward(prompts, completions, answer, environments, **kwargs):
        seen.update(prompts=prompts, completions=completions, answer=answer, env=environments[0], rest=kwargs)
        return [0.25]

    chat = ScriptedChat([call("calculate", {"expression": "3*4"})], [call("submit", {"answer": 12})])
    result = run(chat, reward_fn=reward)
    assert result.reward == 1.25  # get_reward's 1 plus the function's 0.25 (TRL sums its sources)
    assert seen["answer"] == [12] and isinstance(seen["env"], CalculatorEnv) and seen["rest"] == {}
    assert seen["prompts"][0][0]["role"] == "user" and len(seen["prompts"][0]) == 1
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant", "tool"]
    bad = run(ScriptedChat("no"), reward_fn=lambda **kw: 0.5, schedule=parse_schedule("auto"))
    assert (
        bad.reward is None and bad.reason == "the reward function returned 0.5; expected a list of one number"
    )


class FakeServer(ScriptedChat):
    """Answers every request with a submit of 12, counts the episodes in flight, records the posts."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight, self.most, self.posts = 0, 0, []

    async def complete(self, messages, tools, tool_choice, **kw) -> Reply:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)  # let the other episodes start, if the runner lets them
        self.in_flight -= 1
        return Reply(
            {"role": "assistant", "content": None, "tool_calls": [call("submit", {"answer": 12})]},
            "tool_calls",
            3,
            "v2",
        )

    async def post_episode(self, body: dict[str, Any]) -> dict[str, Any]:
        self.posts.append(body)
        received = sum(p["group_id"] == body["group_id"] for p in self.posts)
        status = "used" if received == body["group_size"] else "open"
        return {
            "episode": {},
            "group": {"id": body["group_id"], "status": status, "reason": None, "samples": 4},
        }


def test_groups_post_every_episode_with_their_group_and_respect_the_concurrency():
    server = FakeServer()
    env = EnvSpec("calculator", CalculatorEnv)
    settings = EpisodeSettings(parse_schedule("submit"), max_turns=2)
    runner = Runner(server, env, settings, group_size=3, concurrency=2, tag="t")
    tasks = [Task("a", ROW), Task("b", {**ROW, "answer": 13}), Task("c", {"prompt": "x"})]  # c lacks answer
    groups = asyncio.run(run_all(runner, tasks, groups_at_once(2, 3)))
    assert server.most == 2  # never more than --concurrency episodes answering at once
    assert [g.id for g in groups] == ["t-g00000", "t-g00001", "t-g00002"]
    posted = [p for p in server.posts if p["group_id"] == "t-g00000"]
    assert sorted(p["session_id"] for p in posted) == ["t-g00000-e0", "t-g00000-e1", "t-g00000-e2"]
    assert {(p["group_size"], p["reward"], p["reason"], p["env"], p["task"], p["turns"]) for p in posted} == {
        (3, 1.0, "done", "calculator", "a", 1)
    }
    assert posted[0]["info"]["versions"] == ["v2"] and groups[0].status == "used" and groups[0].samples == 4
    assert {p["reward"] for p in server.posts if p["group_id"] == "t-g00001"} == {0.0}
    # the row that does not fit reset() never reached the server: nothing to post, noted on its group
    assert all(e.dropped and e.turns == 0 for e in groups[2].episodes) and groups[2].status is None
    assert (
        len(groups[2].post_errors) == 3
        and "not posted (the server recorded no answer of it)" in groups[2].post_errors[0]
    )
    assert len(server.posts) == 6


def test_the_shuffled_control_posts_a_groups_rewards_permuted_once_all_its_episodes_ended():
    """Episode e_i submits 10 + i (only e2 is right): with `shuffle`, nothing is posted while an
    episode still runs, the posted rewards are the true ones permuted (seeded), and each post's
    info keeps its episode's true reward, as the report does."""

    class Answers(FakeServer):
        async def complete(self, messages, tools, tool_choice, *, session_id, **kw) -> Reply:
            answer = 10 + int(session_id.rsplit("-e", 1)[1])
            self.in_flight += 1
            await asyncio.sleep(0.01)
            self.in_flight -= 1
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("submit", {"answer": answer})],
            }
            return Reply(message, "tool_calls", 3, "v1")

        async def post_episode(self, body):
            assert self.in_flight == 0 and len(self.posts) < 4
            return await super().post_episode(body)

    server = Answers()
    env, settings = (
        EnvSpec("calculator", CalculatorEnv),
        EpisodeSettings(parse_schedule("submit"), max_turns=2),
    )
    runner = Runner(server, env, settings, group_size=4, concurrency=4, tag="s", shuffle=random.Random(0))
    group = asyncio.run(runner.group(Task("a", ROW)))
    assert [e.reward for e in group.episodes] == [0.0, 0.0, 1.0, 0.0]  # the report keeps the truth
    by_session = {p["session_id"]: p for p in server.posts}
    true = [by_session[f"s-g00000-e{i}"]["info"]["true_reward"] for i in range(4)]
    posted = [by_session[f"s-g00000-e{i}"]["reward"] for i in range(4)]
    assert true == [0.0, 0.0, 1.0, 0.0] and sorted(posted) == sorted(true)
    assert posted != true  # Random(0) moves the one reward of 1 to another episode
    assert group.status == "used"


def test_refused_posts_are_noted_and_the_run_goes_on():
    class Refusing(FakeServer):
        async def post_episode(self, body):
            raise Refused("POST /v1/episodes: http 409: already posted")

    server = Refusing()
    runner = Runner(
        server, EnvSpec("calculator", CalculatorEnv), EpisodeSettings(parse_schedule("submit")), group_size=2
    )
    group = asyncio.run(runner.group(Task("a", ROW)))
    assert [e.reward for e in group.episodes] == [1.0, 1.0]
    assert group.post_errors == [
        f"{group.id}-e{i}: POST /v1/episodes: http 409: already posted" for i in (0, 1)
    ]
    with pytest.raises(ValueError, match="--group-size must be 1 to 1024"):
        Runner(server, EnvSpec("c", CalculatorEnv), EpisodeSettings(), group_size=0)


def test_when_one_episode_fails_the_others_are_cancelled_not_left_running():
    from clawrl.envs.errors import ServerError
    from clawrl.envs.groups import all_or_none

    cancelled = []

    async def fails():
        await asyncio.sleep(0.01)
        raise ServerError("the server is gone")

    async def waits():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(ServerError, match="the server is gone"):
        asyncio.run(asyncio.wait_for(all_or_none([waits(), fails(), waits()]), 10))
    assert cancelled == [True, True]
