"""Collection through the live server: sessions, turns, next states, feedback, restarts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from clawrl.cli import main
from clawrl.store.locks import SERVER_LOCK, holder
from tests.conftest import RemoteServer
from tests.timing import wait_for

SYS = {"role": "system", "content": "You are a helpful assistant."}


def records(run_dir, tmp_path, session=None):
    out = tmp_path / f"records-{time.monotonic_ns()}.jsonl"
    args = ["records", "export", "--run-dir", str(run_dir), "--out", str(out)]
    assert main(args + (["--session", session] if session else [])) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def chat(server, messages, **kw):
    r = server.client().chat.completions.with_raw_response.create(
        model="clawrl", messages=messages, max_tokens=kw.pop("max_tokens", 6), **kw
    )
    return r.parse(), r.headers


class Conversation:
    def __init__(self, server, first):
        self.server, self.messages, self.ids = server, [SYS, {"role": "user", "content": first}], []

    def turn(self, next_user=None, **kw):
        if next_user is not None:
            self.messages.append({"role": "user", "content": next_user})
        r, headers = chat(self.server, self.messages, **kw)
        self.messages.append({"role": "assistant", "content": r.choices[0].message.content})
        self.ids.append(r.id)
        return r, headers


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    s = RemoteServer(tmp_path_factory.mktemp("collect") / "run", ["--model", str(tiny_model_dir)])
    yield s
    s.stop()


def test_three_turns_without_headers_make_one_session(server, tmp_path, tiny_model_dir):
    conv = Conversation(server, "Plan a trip to Rome.")
    _, headers = conv.turn()
    conv.turn("Make it cheaper.")
    conv.turn("No, that's wrong, redo it.")
    session = headers["x-session-id"]
    lines = records(server.run_dir, tmp_path, session)
    assert [line["id"] for line in lines] == conv.ids
    assert [line["turn"] for line in lines] == [0, 1, 2]
    assert {line["turn_type"] for line in lines} == {"main"}
    assert lines[0]["next_state"] == [{"role": "user", "content": "Make it cheaper."}]
    assert lines[1]["next_state"] == [{"role": "user", "content": "No, that's wrong, redo it."}]
    assert lines[2]["next_state"] is None
    # The recorded IDs are what the engine saw and produced, with one logprob per token.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = lines[0]
    rendered = tok.apply_chat_template(first["messages"], add_generation_prompt=True, tokenize=False)
    assert first["prompt_ids"] == tok.encode(rendered, add_special_tokens=False)
    assert len(first["response_ids"]) == len(first["logprobs"]) > 0
    assert all(lp <= 0 for lp in first["logprobs"]) and first["policy_version"] == "v0"
    assert first["response"] == tok.decode(first["response_ids"], skip_special_tokens=True)


def test_interleaved_conversations_stay_apart(server, tmp_path):
    a, b = Conversation(server, "Topic A"), Conversation(server, "Topic B")
    for step in range(3):
        a.turn(None if step == 0 else f"a{step}")
        b.turn(None if step == 0 else f"b{step}")
    by_id = {line["id"]: line for line in records(server.run_dir, tmp_path)}
    sessions_a = {by_id[i]["session_id"] for i in a.ids}
    sessions_b = {by_id[i]["session_id"] for i in b.ids}
    assert len(sessions_a) == 1 and len(sessions_b) == 1 and sessions_a != sessions_b
    assert by_id[a.ids[1]]["next_state"][0]["content"] == "a2"
    assert by_id[b.ids[1]]["next_state"][0]["content"] == "b2"


def test_title_request_is_a_side_turn_and_does_not_break_the_session(server, tmp_path):
    conv = Conversation(server, "Explain recursion.")
    r1, h1 = conv.turn()
    side, _ = chat(
        server, conv.messages + [{"role": "user", "content": "Generate a short title for this conversation."}]
    )
    r2, h2 = conv.turn("Give an example.")
    by_id = {line["id"]: line for line in records(server.run_dir, tmp_path)}
    assert by_id[side.id]["turn_type"] == "side"
    assert by_id[side.id]["session_id"] == h1["x-session-id"] == h2["x-session-id"]
    assert by_id[r1.id]["next_state"] == [{"role": "user", "content": "Give an example."}]


def test_explicit_session_header_and_done(server, tmp_path):
    messages = [{"role": "user", "content": "hello"}]
    _, headers = chat(server, messages, extra_headers={"X-Session-Id": "agent-42", "X-Turn-Type": "side"})
    assert headers["x-session-id"] == "agent-42"
    chat(server, messages, extra_body={"session_id": "agent-42", "session_done": True})
    lines = records(server.run_dir, tmp_path, "agent-42")
    assert [line["turn_type"] for line in lines] == ["side", "main"]


def test_an_answer_resent_rewritten_under_an_affinity_key_still_gets_its_next_state(server, tmp_path):
    """A client resends an answer rewritten (OpenClaw strips <think> blocks and reply directives): under
    its affinity key the next question is still that answer's next state, recorded as matched to a
    rewritten answer; without a key the same resend opens a new session (inference matches exact
    histories only)."""
    key = {"x-session-affinity": "oc-rewrite:0"}
    first = [SYS, {"role": "user", "content": "What is the capital of France?"}]
    r1, h1 = chat(server, first, extra_headers=key)
    rewritten = {"role": "assistant", "content": f"(rewritten) {r1.choices[0].message.content}"}
    question = {"role": "user", "content": "What is 2 + 3?"}
    r2, h2 = chat(server, [*first, rewritten, question], extra_headers=key)
    assert h1["x-session-id"] == h2["x-session-id"] == "oc-rewrite:0"
    by_id = {line["id"]: line for line in records(server.run_dir, tmp_path, "oc-rewrite:0")}
    assert by_id[r1.id]["next_state"] == [question] and by_id[r1.id]["next_state_match"] == "rewritten"
    assert by_id[r2.id]["turn_type"] == "main" and by_id[r2.id]["next_state"] is None

    first = [SYS, {"role": "user", "content": "What is the capital of Italy?"}]
    r3, h3 = chat(server, first)
    rewritten = {"role": "assistant", "content": f"(rewritten) {r3.choices[0].message.content}"}
    _, h4 = chat(server, [*first, rewritten, question])
    assert h3["x-session-id"] != h4["x-session-id"]
    (line,) = records(server.run_dir, tmp_path, h3["x-session-id"])
    assert line["next_state"] is None and line["next_state_match"] is None


def test_feedback_lands_on_the_right_turn(server, tmp_path):
    conv = Conversation(server, "Write a haiku.")
    r1, headers = conv.turn()
    r2, _ = conv.turn("Another one.")
    url = server.url + "/v1/feedback"
    ok = httpx.post(url, json={"response_id": r1.id, "rating": -1, "comment": "too long"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["response_id"] == r1.id
    latest = httpx.post(url, json={"session_id": headers["x-session-id"], "rating": 1}, timeout=10)
    assert latest.json()["response_id"] == r2.id
    by_id = {line["id"]: line for line in records(server.run_dir, tmp_path)}
    assert [(f["rating"], f["comment"]) for f in by_id[r1.id]["feedback"]] == [(-1, "too long")]
    assert [f["rating"] for f in by_id[r2.id]["feedback"]] == [1]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"response_id": "chatcmpl-nope", "rating": 1}, 404, "chatcmpl-nope"),
        ({"session_id": "no-such-session", "rating": 1}, 404, "no-such-session"),
        ({"response_id": "x", "rating": 5}, 400, "rating"),
        ({"rating": 1}, 400, "exactly one"),
        ({"response_id": "x", "session_id": "y", "rating": 1}, 400, "exactly one"),
    ],
)
def test_bad_feedback(server, body, status, needle):
    r = httpx.post(server.url + "/v1/feedback", json=body, timeout=10)
    assert r.status_code == status
    assert needle in r.json()["error"]["message"] + str(r.json()["error"]["param"])


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Session-Id": "has spaces"},
        {"X-Session-Id": "x" * 129},
        {"X-Turn-Type": "maybe"},
        {"X-Session-Done": "perhaps"},
    ],
)
def test_malformed_session_headers_are_rejected(server, headers):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        headers=headers,
        timeout=10,
        json={"model": "clawrl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 400
    assert list(headers)[0] in r.json()["error"]["message"]


def test_cut_off_stream_is_recorded_as_abort(server, tmp_path):
    body = {
        "model": "clawrl",
        "messages": [{"role": "user", "content": "long please"}],
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
    ):
        events = (
            json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: ")
        )
        first = next(events)
        for _ in range(3):  # three tokens arrive, then the client hangs up
            next(events)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [line for line in records(server.run_dir, tmp_path) if line["id"] == first["id"]]
        if found:
            break
        time.sleep(0.1)
    assert found and found[0]["finish_reason"] == "abort" and 0 < len(found[0]["response_ids"]) < 400


def test_sigkill_mid_conversation_loses_nothing(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    first = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    conv = Conversation(first, "Count sheep.")
    conv.turn()
    conv.turn("More sheep.")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    first.log.close()
    # Under the suite's preloader (tests/preload) the killed stand-in takes the forked server with it
    # a moment later; the second server may take the run folder once the first's lock is gone
    # (clawrl/store/locks.py).
    wait_for(lambda: holder(run_dir, SERVER_LOCK) is None, 30, "the killed server gone")
    second = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    try:
        conv.server = second
        _, headers = conv.turn("Even more sheep.")
        lines = records(run_dir, tmp_path)
        assert [line["id"] for line in lines] == conv.ids
        assert len({line["session_id"] for line in lines}) == 1 == len({headers["x-session-id"]})
        assert lines[1]["next_state"] == [{"role": "user", "content": "Even more sheep."}]
        assert [line["turn"] for line in lines] == [0, 1, 2]
    finally:
        second.stop()


def test_unwritable_store_fails_at_start(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    (run_dir / "clawrl.db").mkdir(parents=True)  # a folder where the database file must go
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clawrl",
            "serve",
            "--model",
            str(tiny_model_dir),
            "--run-dir",
            str(run_dir),
            "--server.port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "cannot record conversations" in proc.stderr and "clawrl.db" in proc.stderr
