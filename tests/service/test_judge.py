"""Judging through the live server with a real (scripted) OpenAI-compatible judge endpoint."""

from __future__ import annotations

import time

import httpx
import pytest

from clawrl.store.db import Store
from tests.conftest import RemoteServer
from tests.service.scripted_judge import HINT, ScriptedJudge


@pytest.fixture(scope="module")
def judge():
    j = ScriptedJudge()
    yield j
    j.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, judge):
    args = [
        "--model",
        str(tiny_model_dir),
        "--judge.backend",
        "openai",
        "--judge.base-url",
        judge.url,
        "--judge.model",
        "scripted",
        "--judge.timeout-s",
        "1",
        "--judge.retries",
        "1",
        "--judge.backoff-s",
        "0.05",
        "--method",
        "combine",
    ]
    s = RemoteServer(tmp_path_factory.mktemp("judge") / "run", args)
    yield s
    s.stop()


def converse(server, first, reply):
    r1, r2 = two_turns(server.client(), first, reply)
    return r1.id, r2


def two_turns(client, first: str, reply: str, max_tokens: int = 5):
    """Ask `first`, then send `reply` after the answer (the first answer's next state): (r1, r2)."""
    messages = [{"role": "user", "content": first}]
    r1 = client.chat.completions.create(model="clawrl", messages=messages, max_tokens=max_tokens)
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": reply},
    ]
    r2 = client.chat.completions.create(model="clawrl", messages=messages, max_tokens=max_tokens)
    return r1, r2


def judged(server, turn_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        while time.monotonic() < deadline:
            j = store.latest_judgment(turn_id)
            if j is not None:
                return j, [s for s in store.ready_samples() if s.turn_id == turn_id]
            time.sleep(0.1)
    raise AssertionError(f"{turn_id} was not judged within {timeout}s")


def test_redo_request_scores_minus_one_with_a_hint(server):
    turn_id, _ = converse(server, "Write a poem about the sea.", "No, that's wrong, redo it.")
    j, samples = judged(server, turn_id)
    assert j.judge == "openai:scripted"
    assert [v.value for v in j.votes if v.kind == "prm"] == [-1, -1, -1]
    assert j.score == -1 and j.hint == HINT
    assert all(v.raw and v.error is None and v.latency_s > 0 for v in j.votes)
    (opd,) = [s for s in samples if not s.rewrite]  # combine: one sample per turn, the hinted one carrying r
    assert opd.kind == "opd" and opd.reward == -1
    assert opd.teacher_prompt_ids != opd.prompt_ids
    # train.hint_rewrite (on by default): the answer written again with the hint, on the bare prompt
    (rewrite,) = [s for s in samples if s.rewrite]
    assert (rewrite.kind, rewrite.reward, rewrite.prompt_ids) == ("opd", 0.0, opd.prompt_ids)
    assert rewrite.teacher_prompt_ids == opd.teacher_prompt_ids and rewrite.response_ids
    assert server.health()["judge"]["hint_rewrite"] is True  # a client pacing its ratings counts it


def test_thanks_scores_plus_one_without_hint(server):
    turn_id, _ = converse(server, "Say hi.", "Thanks, perfect!")
    j, samples = judged(server, turn_id)
    assert j.score == 1 and j.hint is None
    assert [(s.kind, s.reward) for s in samples] == [("rl", 1)]


def test_judge_timeouts_are_failed_votes_and_degrade_health(server):
    before = server.health()["judge"]["failed_votes"]
    start = time.monotonic()
    turn_id, r2 = converse(server, "Tell a joke.", "SLOWJUDGE thanks")
    assert time.monotonic() - start < 10  # serving did not wait for the judge
    j, samples = judged(server, turn_id, timeout=60)
    prm = [v for v in j.votes if v.kind == "prm"]
    assert [v.value for v in prm] == [None, None, None]
    assert all(v.raw is None and "timeout" in v.error for v in prm)
    assert j.score == 0 and samples == []
    health = server.health()
    assert health["status"] == "ok" and health["judge"]["status"] == "degraded"
    assert health["judge"]["failed_votes"] >= before + 6
    # Serving is unaffected while the judge fails.
    ok = server.client().chat.completions.create(
        model="clawrl", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert ok.choices[0].message.role == "assistant"


def test_garbage_judge_replies_are_recorded_failures(server):
    turn_id, _ = converse(server, "Name a color.", "GARBAGEJUDGE ok")
    j, _ = judged(server, turn_id, timeout=60)
    assert j.score == 0
    assert all(v.value is None and "not a chat completion" in v.error for v in j.votes)


def test_explicit_feedback_decides_the_reward(server):
    turn_id, _ = converse(server, "Write a haiku.", "Thanks, perfect!")
    j, _ = judged(server, turn_id)
    assert j.score == 1
    r = httpx.post(
        server.url + "/v1/feedback",
        timeout=10,
        json={"response_id": turn_id, "rating": -1, "comment": "Use exactly three lines, no title."},
    )
    assert r.status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        j2, samples = judged(server, turn_id)
        if j2.id != j.id:
            break
        time.sleep(0.1)
    assert j2.score == -1 and j2.hint == "Use exactly three lines, no title."
    # one sample carrying r, and the hint rewrite (train.hint_rewrite) beside it
    assert [(s.kind, s.reward, s.rewrite) for s in samples] == [("opd", -1, False), ("opd", 0, True)]
