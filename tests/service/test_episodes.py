"""Track 2's episode route on a live server: episodes of tool-calling sessions, posted with their
rewards, become GRPO groups; a complete group's main turns become samples the real trainer trains.

Episodes are driven here by hand with the real `openai` client (the runner of clawrl/envs is
tested in its own files): each is one session (`X-Session-Id`), a tool call answered by a `tool`
message, then a final answer.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from clawrl.store.db import Store
from tests.conftest import RemoteServer
from tests.timing import wait_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def run_episode(server, session: str) -> int:
    """Two turns in one session: a question, then the tool's result as the next state. Returns turns."""
    client = server.client().with_options(default_headers={"X-Session-Id": session})
    messages = [{"role": "user", "content": "What is 12 * 7? Use the calculator."}]
    first = client.chat.completions.create(model="clawrl", messages=messages, tools=TOOLS, max_tokens=8)
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "12*7"}'},
                }
            ],
        }
        if not first.choices[0].message.content
        else {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "The calculator says 84."},
    ]
    client.chat.completions.create(model="clawrl", messages=messages, tools=TOOLS, max_tokens=8)
    return 2


def post(server, **body):
    return httpx.post(server.url + "/v1/episodes", json=body, timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    s = RemoteServer(
        tmp_path_factory.mktemp("episodes") / "run",
        ["--model", str(tiny_model_dir), "--method", "grpo", "--judge.backend", "feedback"],
    )
    yield s
    s.stop()


def test_a_complete_group_becomes_samples_of_every_main_turn(server):
    group = f"g-{uuid.uuid4().hex[:8]}"
    sessions = [f"ep-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for session in sessions:
        run_episode(server, session)
    replies = [
        post(
            server,
            session_id=s,
            group_id=group,
            group_size=3,
            reward=r,
            reason="answered",
            turns=2,
            env="calc",
        )
        for s, r in zip(sessions, [1.0, 0.0, 0.0], strict=True)
    ]
    assert [r.status_code for r in replies] == [200, 200, 200], replies[-1].text
    first, last = replies[0].json()["group"], replies[-1].json()["group"]
    assert (first["status"], first["received"]) == ("open", 1)
    assert (last["status"], last["received"], last["samples"]) == ("used", 3, 6)  # 3 episodes x 2 main turns
    assert last["reward_mean"] == pytest.approx(1 / 3)
    shown = httpx.get(f"{server.url}/v1/episodes/groups/{group}").json()
    assert [e["reward"] for e in shown["episodes"]] == [1.0, 0.0, 0.0]
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        samples = [
            s for s in store.ready_samples() if s.turn_id in {t.id for x in sessions for t in store.turns(x)}
        ]
        winner = {t.id for t in store.turns(sessions[0])}
    assert len(samples) == 6
    assert all(s.reward > 0 for s in samples if s.turn_id in winner)
    assert all(s.reward < 0 for s in samples if s.turn_id not in winner)


def test_a_group_of_equal_rewards_is_dropped_and_counted(server):
    group = f"g-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        session = f"ep-{uuid.uuid4().hex[:8]}"
        run_episode(server, session)
        reply = post(server, session_id=session, group_id=group, group_size=2, reward=1.0)
    assert reply.json()["group"]["status"] == "dropped"
    assert reply.json()["group"]["reason"] == "equal rewards (1)"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'clawrl_groups_total{status="dropped"}' in metrics
    state = wait_for(
        lambda: next(
            (
                g
                for g in httpx.get(server.url + "/dashboard/state.json").json()["store"]["groups"]
                if g["id"] == group
            ),
            None,
        ),
        30,
        "the group on the dashboard",
    )
    assert (state["status"], state["received"], state["size"]) == ("dropped", 2, 2)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"reward": 1.0, "session_id": "never-seen"}, 404, "no session 'never-seen'"),
        ({"reward": "NaN"}, 400, "reward"),
        ({"reward": 1.0, "group_size": 0}, 400, "group_size"),
        ({"reward": 1.0, "surprise": 1}, 400, "surprise"),
    ],
)
def test_bad_episodes_get_a_clear_4xx(server, body, status, says):
    session = f"ep-{uuid.uuid4().hex[:8]}"
    run_episode(server, session)
    reply = post(server, **({"session_id": session, "group_id": "g-bad", "group_size": 2} | body))
    assert reply.status_code == status, reply.text
    assert says in reply.json()["error"]["message"]


def test_an_episode_posted_twice_is_a_conflict_and_loses_nothing(server):
    session = f"ep-{uuid.uuid4().hex[:8]}"
    run_episode(server, session)
    group = f"g-{uuid.uuid4().hex[:8]}"
    assert post(server, session_id=session, group_id=group, group_size=2, reward=0.5).status_code == 200
    again = post(server, session_id=session, group_id=group, group_size=2, reward=0.9)
    assert again.status_code == 409 and "already recorded" in again.json()["error"]["message"]
    other = f"ep-{uuid.uuid4().hex[:8]}"
    run_episode(server, other)
    resized = post(server, session_id=other, group_id=group, group_size=4, reward=0.0)
    assert resized.status_code == 409 and "size 2, not 4" in resized.json()["error"]["message"]
    shown = httpx.get(f"{server.url}/v1/episodes/groups/{group}").json()
    assert [e["reward"] for e in shown["episodes"]] == [0.5]


def test_a_group_whose_other_episodes_never_came_is_closed_with_the_ones_it_has(server):
    """Three of four episodes reached the server (the fourth failed before its first answer, so it
    has no session to post): the runner closes the group, which trains on the three; a second
    close changes nothing, and an unknown group is a 404."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    sessions = [f"ep-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for session, reward in zip(sessions, [1.0, 0.0, 1.0], strict=True):
        run_episode(server, session)
        reply = post(server, session_id=session, group_id=group, group_size=4, reward=reward, turns=2)
    assert (reply.json()["group"]["status"], reply.json()["group"]["received"]) == ("open", 3)
    close = f"{server.url}/v1/episodes/groups/{group}/close"
    closed = httpx.post(close, json={"reason": "reset() raised ValueError"}, timeout=30)
    assert closed.status_code == 200, closed.text
    body = closed.json()
    assert (body["status"], body["received"], body["size"], body["samples"]) == ("used", 3, 4, 6)
    assert body["reason"] == "closed with 3 of 4 episodes: reset() raised ValueError"
    assert body["reward_mean"] == pytest.approx(2 / 3)
    again = httpx.post(close, timeout=30)  # no body: the reason is optional
    assert again.status_code == 200 and again.json()["samples"] == 6
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        turns = {t.id for s in sessions for t in store.turns(s)}
        assert len([s for s in store.ready_samples() if s.turn_id in turns]) == 6  # trained once only
    missing = httpx.post(f"{server.url}/v1/episodes/groups/g-never/close", json={}, timeout=30)
    assert missing.status_code == 404 and "g-never" in missing.json()["error"]["message"]
    bad = httpx.post(close, json={"why": "x"}, timeout=30)
    assert bad.status_code == 400 and "why" in bad.json()["error"]["message"]


def test_the_trainer_trains_a_group_into_a_version(tmp_path, tiny_model_dir):
    server = RemoteServer(
        tmp_path / "run",
        [
            "--model",
            str(tiny_model_dir),
            "--method",
            "grpo",
            "--judge.backend",
            "feedback",
            "--train.enabled",
            "true",
            "--train.batch-size",
            "4",
            "--train.poll-s",
            "0.2",
            "--train.swap-poll-s",
            "0.2",
            "--train.nice",
            "0",
        ],
    )
    try:
        sessions = [f"ep-{i}" for i in range(2)]
        for session in sessions:
            run_episode(server, session)
        for session, reward in zip(sessions, [1.0, 0.0], strict=True):
            post(server, session_id=session, group_id="g", group_size=2, reward=reward).raise_for_status()
        wait_for(
            lambda: httpx.get(server.url + "/v1/models").json()["data"][0]["version"] == "v1",
            240,
            "v1 served",
        )
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            assert store.count_samples("trained") == 4
    finally:
        server.stop()


def test_records_show_episodes_with_group_reward_and_tool_calls(server, tmp_path, capsys):
    from clawrl.cli import main

    session, group = f"ep-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    run_episode(server, session)
    body = dict(session_id=session, group_id=group, group_size=2, reward=0.75, reason="done", tool_calls=1)
    post(server, **body, env="calculator").raise_for_status()
    assert main(["records", "episodes", "--run-dir", str(server.run_dir)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(session))
    assert f"group {group} (2)" in line and "reward 0.75" in line and "1 tool calls" in line
    out = tmp_path / "turns.jsonl"
    assert (
        main(["records", "export", "--run-dir", str(server.run_dir), "--session", session, "--out", str(out)])
        == 0
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and all(
        x["episode"]["group_id"] == group and x["episode"]["reward"] == 0.75 for x in lines
    )
    assert main(["records", "show", "--run-dir", str(server.run_dir), "--session", session]) == 0
    assert f"episode of group {group}: reward 0.75 (done), group open" in capsys.readouterr().out


def test_a_restart_closes_the_groups_whose_episodes_were_all_in(tmp_path, tiny_model_dir):
    """A server that stopped between the last episode and closing its group: the next one closes it."""
    from clawrl.testing import make_turn
    from clawrl.types import Episode

    run = tmp_path / "run"
    with Store.open(run / "clawrl.db") as store:  # what the stopped server left on disk
        for i, reward in enumerate([1.0, 0.0]):
            store.upsert_session(f"ep-{i}", "header", 1.0)
            store.insert_turn(make_turn(f"t{i}", f"ep-{i}", 0, versions=["v0"]))
            store.record_episode(Episode(f"ep-{i}", "g-left", 2, reward, "answered"))
        assert store.group("g-left").status == "open"
    server = RemoteServer(run, ["--model", str(tiny_model_dir), "--method", "grpo"])
    try:
        group = httpx.get(f"{server.url}/v1/episodes/groups/g-left").json()
        assert (group["status"], group["samples"]) == ("used", 2)
    finally:
        server.stop()
