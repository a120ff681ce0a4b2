"""Episodes through a live server (a real `clawrl serve` on the tiny random model, method grpo):
each episode one session, its tool results recorded as the next states of its tool-call turns, its
reward posted to POST /v1/episodes and the group closed once all of it is in.

The forced tool schedule (`calculate,submit`, or a tool named per turn) makes the server decode
each answer under a grammar (clawrl/chat/grammar.py), so even a random model makes a parseable call
of the tool asked for: what these tests check does not depend on the model being any good."""

from __future__ import annotations

import asyncio
import json
import textwrap

import httpx
import pytest

from clawrl.cli import main
from clawrl.envs.client import EnvClient
from clawrl.envs.episode import EpisodeSettings, Refused
from clawrl.envs.groups import Runner, Task, episode_body
from clawrl.envs.load import load_env
from clawrl.envs.schedule import parse_schedule
from tests.conftest import RemoteServer

# A TRL-style environment (it imports nothing from clawrl) whose tools misbehave on purpose.
FAULTY_ENV = '''
import threading


class FaultyEnv:
    def __init__(self):
        self.done = False
        self.release = threading.Event()

    def reset(self, **row):
        self.done = False
        return None

    def boom(self) -> str:
        """Always fails.

        Args:
        """
        raise RuntimeError("the tool broke")

    def hang(self) -> str:
        """Never answers in time.

        Args:
        """
        self.release.wait(20)
        return "too late"

    def finish(self) -> str:
        """End the task.

        Args:
        """
        self.done = True
        self.release.set()
        return "finished"

    def get_reward(self) -> float:
        return 0.5
'''


# One episode in three cannot start (its sandbox is gone before the first answer); the others
# end on their first call, rewarded 0 and 1.
FLAKY_ENV = '''
import itertools


class FlakyEnv:
    built = itertools.count()

    def __init__(self):
        self.n = next(FlakyEnv.built)

    def reset(self, **row):
        if self.n % 3 == 2:
            raise OSError("no sandbox left")

    def finish(self) -> str:
        """End the task.

        Args:
        """
        self.done = True
        return "finished"

    def get_reward(self) -> float:
        return float(self.n % 3)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp("envs") / "run"
    s = RemoteServer(
        run_dir, ["--model", str(tiny_model_dir), "--method", "grpo", "--judge.enabled", "false"]
    )
    yield s
    s.stop()


def records(server, tmp_path, session):
    out = tmp_path / f"{session}.jsonl"
    assert (
        main(["records", "export", "--run-dir", str(server.run_dir), "--out", str(out), "--session", session])
        == 0
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def run_group(server, env, task, schedule, group_size, **settings):
    async def go():
        async with EnvClient(server.url) as client:
            await client.health()
            runner = Runner(
                client,
                env,
                EpisodeSettings(parse_schedule(schedule), **settings),
                group_size=group_size,
                concurrency=2,
            )
            return await runner.group(task)

    return asyncio.run(asyncio.wait_for(go(), 240))


def test_a_group_of_calculator_episodes_is_recorded_and_closed(server, tmp_path):
    env = load_env("calculator")
    row = {
        "prompt": [{"role": "user", "content": "Ana buys 3 cards at 4 dollars each. How much?"}],
        "answer": 12,
    }
    # 100 tokens for the episode: the tiny model's 512-token window holds the prompt (~300) and both answers
    group = run_group(server, env, Task("calc-1", row), "calculate,submit", 3, max_turns=2, max_tokens=100)
    assert len(group.episodes) == 3 and group.post_errors == []
    for episode in group.episodes:
        assert episode.reason in ("done", "turn_limit", "token_limit"), episode.reason
        assert episode.reward in (0.0, 1.0) and episode.tool_calls >= 1
        lines = records(server, tmp_path, episode.session_id)
        assert [line["turn"] for line in lines] == list(range(episode.turns))
        # the forced first call is calculate; the tool messages the next request carried are its next state
        assert [c["function"]["name"] for c in lines[0]["tool_calls"]] == ["calculate"]
        answers = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"]
        for line, at, after in zip(lines, answers, [*answers[1:], None], strict=True):
            sent = [m for m in episode.messages[at + 1 : after] if m["role"] == "tool"]
            assert line["next_state"] == (sent if after is not None else None), line["turn"]
        assert lines[0]["episode"]["group_id"] == group.id and lines[0]["episode"]["reward"] == episode.reward
    assert any(e.turns == 2 for e in group.episodes)  # some calculate result did go back as a next state
    # the server closed the group once the third episode was in
    found = httpx.get(f"{server.url}/v1/episodes/groups/{group.id}", timeout=30).json()
    assert found["size"] == 3 and found["received"] == 3 and found["status"] in ("used", "dropped")
    assert group.status == found["status"]
    assert sorted(e["session_id"] for e in found["episodes"]) == sorted(e.session_id for e in group.episodes)
    if len({e.reward for e in group.episodes}) == 1:
        assert found["status"] == "dropped" and found["reason"]  # equal rewards teach nothing

    # posting an episode again is refused: it is recorded once
    async def again():
        async with EnvClient(server.url) as client:
            await client.post_episode(episode_body(group.episodes[0], group.id, 3, "calculator"))

    with pytest.raises(Refused, match="http 409"):
        asyncio.run(again())


def test_a_tool_that_raises_or_hangs_gives_error_messages_and_the_episode_goes_on(server, tmp_path):
    path = tmp_path / "faulty_env.py"
    path.write_text(textwrap.dedent(FAULTY_ENV))
    env = load_env(f"{path}:FaultyEnv")
    group = run_group(
        server, env, Task("faulty", {"prompt": "Do the thing."}), "boom,hang,finish", 1,
        max_turns=4, max_tokens=200, tool_timeout_s=0.5,
    )  # fmt: skip
    (episode,) = group.episodes
    assert (episode.reward, episode.reason, episode.turns, episode.tool_errors) == (0.5, "done", 3, 2)
    lines = records(server, tmp_path, episode.session_id)
    states = [line["next_state"] for line in lines]
    assert json.loads(states[0][0]["content"]) == {"error": "the tool broke"}
    assert json.loads(states[1][0]["content"]) == {"error": "the tool hang did not return within 0.5 s"}
    assert states[2] is None  # the episode ended on the finish call: its result was never sent
    assert [line["tool_calls"][0]["function"]["name"] for line in lines] == ["boom", "hang", "finish"]
    assert lines[0]["episode"]["reason"] == "done"
    assert group.status == "dropped"  # a group of one has no one to compare with


def test_a_row_that_does_not_fit_reset_is_dropped_and_never_reaches_the_server(server, tmp_path):
    env = load_env("calculator")  # its reset needs an `answer` column
    group = run_group(server, env, Task("no-answer", {"prompt": "What is 2+2?"}), "calculate,submit", 2)
    assert all(e.dropped and e.turns == 0 for e in group.episodes)
    assert group.episodes[0].reason.startswith(
        "the task row does not fit reset(): missing a required argument"
    )
    assert group.status is None and len(group.post_errors) == 2


def test_a_group_whose_episode_never_reached_the_server_is_closed_with_the_others(server, tmp_path):
    path = tmp_path / "flaky_env.py"
    path.write_text(textwrap.dedent(FLAKY_ENV))
    env = load_env(f"{path}:FlakyEnv")
    task = Task("flaky", {"prompt": "Finish."})
    group = run_group(server, env, task, "finish", 3, max_turns=2, max_tokens=200)
    never = [e for e in group.episodes if e.turns == 0]
    assert len(never) == 1 and "no sandbox left" in never[0].reason
    assert sorted(e.reward for e in group.episodes if e.turns) == [0.0, 1.0]
    # Not left open waiting for the third: closed with the two, which differ, so trained on.
    assert (group.status, group.samples) == ("used", 2), group
    assert group.reason.startswith("closed with 2 of 3 episodes: 1 never reached the server")
    shown = httpx.get(f"{server.url}/v1/episodes/groups/{group.id}", timeout=30).json()
    assert (shown["status"], shown["received"], shown["size"]) == ("used", 2, 3)
