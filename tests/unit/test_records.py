"""The JSONL export, the human view, and `clawrl records export|show` through the real CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.store.db import Store, StoreError
from clawrl.store.records import export, record, show
from clawrl.testing import make_turn
from clawrl.types import Feedback, Judgment, Vote

LONG = "Voici un très long message. " * 40  # ~1,100 characters
KEYS = {
    "id", "session_id", "turn", "turn_type", "messages", "tools", "response", "tool_calls", "prompt_ids",
    "response_ids", "logprobs", "policy_version", "versions", "temperature", "finish_reason", "next_state",
    "next_state_at", "next_state_match", "feedback", "judgment", "reward", "episode", "created_at",
    "first_token_at", "finished_at", "memory", "sampling", "user", "reasoning",
}  # fmt: skip
VOTES = [
    Vote("prm", 1, "Correct. \\boxed{1}", None, 1.5),
    Vote("prm", None, None, None, 30.0, "timeout after 30s"),
    Vote("hint", 1, "[HINT_START]Give the unit.[HINT_END]", "Give the unit.", 2.25),
]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run folder whose store holds two sessions: s1 (judged, rated, with a next state) and s2."""
    run = tmp_path / "run"
    with Store.open(run / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        store.insert_turn(make_turn("t0", "s1", 0, created_at=10.0))
        store.insert_turn(
            make_turn("t1", "s1", 1, created_at=20.0, messages=[{"role": "user", "content": LONG}])
        )
        store.set_next_state("t0", [{"role": "tool", "tool_call_id": "call_0", "content": "12 °C"}], 15.0)
        store.add_feedback(Feedback("t0", 1, "parfait", 16.0))
        store.upsert_session("s2", "inferred", 1.0, "alice")
        store.insert_turn(make_turn("u0", "s2", 0, created_at=15.0, turn_type="side", versions=[]))
        store.insert_judgment(Judgment("t0", "openai:judge", VOTES, 1, "Give the unit.", 17.0))
    return run


@pytest.fixture
def store(run_dir: Path):
    with Store.open(run_dir / "clawrl.db", readonly=True) as s:
        yield s


def test_record_has_every_key_and_the_turns_values(store):
    line = record(store, store.get_turn("t0"))
    assert set(line) == KEYS
    turn = make_turn("t0", "s1", 0, created_at=10.0)
    assert line["turn"] == 0 and line["response"] == turn.response_text
    for key in ("messages", "tools", "tool_calls", "prompt_ids", "response_ids", "logprobs", "versions"):
        assert line[key] == getattr(turn, key), key
    assert line["policy_version"] == "v2"
    assert line["next_state"] == [{"role": "tool", "tool_call_id": "call_0", "content": "12 °C"}]
    assert line["feedback"] == [{"rating": 1, "comment": "parfait", "created_at": 16.0}]
    judgment = dict(line["judgment"])
    votes = judgment.pop("votes")
    assert judgment == {"score": 1, "hint": "Give the unit.", "judge": "openai:judge"}
    failed = {"kind": "prm", "value": None, "raw": None, "hint": None, "latency_s": 30.0}
    assert votes[1] == {**failed, "error": "timeout after 30s"}
    assert [(v["kind"], v["value"], v["hint"], v["latency_s"]) for v in votes] == [
        ("prm", 1, None, 1.5),
        ("prm", None, None, 30.0),
        ("hint", 1, "Give the unit.", 2.25),
    ]
    assert votes[0]["raw"] == "Correct. \\boxed{1}" and votes[2]["raw"].startswith("[HINT_START]")
    assert line["reward"] == 1
    assert json.loads(json.dumps(line)) == line  # what export writes reads back the same
    assert (line["created_at"], line["finished_at"]) == (10.0, turn.finished_at)


def test_record_without_judgment_or_next_state(store):
    line = record(store, store.get_turn("u0"))
    assert (line["judgment"], line["reward"], line["next_state"], line["feedback"]) == (None, None, None, [])
    assert line["policy_version"] == "v0" and line["turn_type"] == "side"


def test_export_writes_one_utf8_line_per_turn_in_order(store):
    out = io.StringIO()
    assert export(store, out) == 3
    text = out.getvalue()
    assert "Zürich" in text and "\\u" not in text  # ensure_ascii=False
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["id"] for line in lines] == ["t0", "u0", "t1"]  # by created_at
    one = io.StringIO()
    assert export(store, one, session_id="s1") == 2
    assert [json.loads(line)["turn"] for line in one.getvalue().splitlines()] == [0, 1]


def test_show_prints_a_session_for_a_human(store):
    out = io.StringIO()
    show(store, "s1", out)
    text = out.getvalue()
    assert text.startswith("session s1: 2 turns\n")
    assert "[0] main  v2  finish: tool_calls" in text
    assert "prompt (user): Quel temps fait-il à Zürich ?" in text
    assert "answer: Il fait « beau » — 晴れ." in text
    assert 'tool call: weather({"q": "Zürich"})' in text
    assert "tool: 12 °C" in text and "feedback: +1  parfait" in text
    assert "judgment: score 1  votes prm +1, prm failed (timeout after 30s), hint +1  by openai:judge" in text
    assert "hint: Give the unit." in text
    assert "next state: (none)" in text
    assert LONG.strip() not in text and "Voici un très long message." in text  # clipped
    assert max(len(line) for line in text.splitlines()) < 350


def test_show_names_the_older_version_whose_kv_a_prompt_started_from(tmp_path):
    sampling = {"logprobs": "tempered", "prefix_kv_version": "v1"}
    with Store.open(tmp_path / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        store.insert_turn(make_turn("t0", "s1", 0, created_at=10.0, sampling=sampling))
        out = io.StringIO()
        show(store, "s1", out)
        (turn,) = store.turns()
    assert "prompt prefix: KV computed by v1 (the prefix cache, across a swap)" in out.getvalue()
    assert turn.sampling == sampling and not turn.logprobs_exact  # a mixed computation, weighted


def test_a_next_state_matched_to_a_rewritten_answer_says_so(tmp_path):
    """The client resent the answer folded (clawrl/sessions/tracker.py): export and show tell it."""
    with Store.open(tmp_path / "clawrl.db") as store:
        store.upsert_session("oc-1:0", "affinity", 1.0)
        for i, turn_id in enumerate(("t0", "t1", "t2")):
            store.insert_turn(make_turn(turn_id, "oc-1:0", i, created_at=10.0 + i))
        store.set_next_state("t0", [{"role": "user", "content": "What is 2 + 3?"}], 12.0, "rewritten")
        store.set_next_state("t1", [{"role": "user", "content": "Thanks!"}], 13.0, "history")
        lines = [record(store, turn) for turn in store.turns()]
        out = io.StringIO()
        show(store, "oc-1:0", out)
    assert [line["next_state_match"] for line in lines] == ["rewritten", "history", None]
    text = out.getvalue()
    assert text.count("next state: (the client resent this answer rewritten") == 1
    assert text.count("next state:\n") == 1 and "next state: (none)" in text  # t1's plain, t2's none


def test_a_thinking_turn_keeps_its_reasoning_and_template_variables_through_the_store(tmp_path):
    """The reasoning beside the content (clawrl/chat/reasoning.py): stored, exported, shown."""
    thought = make_turn(
        "t0",
        "s1",
        0,
        created_at=10.0,
        reasoning="Maybe 12 °C, in Paris.",
        chat_template_kwargs={"enable_thinking": True},
    )
    with Store.open(tmp_path / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        store.insert_turn(thought)
        store.insert_turn(make_turn("t1", "s1", 1, created_at=11.0))
        lines = [record(store, turn) for turn in store.turns()]
        out = io.StringIO()
        show(store, "s1", out)
        assert store.get_turn("t0") == thought
        assert (store.get_turn("t1").reasoning, store.get_turn("t1").chat_template_kwargs) == (None, None)
    assert [line["reasoning"] for line in lines] == ["Maybe 12 °C, in Paris.", None]
    assert out.getvalue().count("  reasoning: Maybe 12 °C, in Paris.\n  answer: ") == 1


def test_show_of_an_unknown_session(store):
    with pytest.raises(StoreError, match="no session 'nope'"):
        show(store, "nope", io.StringIO())


def test_cli_export_to_a_file_and_to_stdout(run_dir, tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    assert main(["records", "export", "--run-dir", str(run_dir), "--out", str(out)]) == 0
    assert [json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines()] == [
        "t0",
        "u0",
        "t1",
    ]
    assert "wrote 3 turns" in capsys.readouterr().err
    assert main(["records", "export", "--run-dir", str(run_dir), "--session", "s2"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["u0"]


def test_cli_show(run_dir, capsys):
    assert main(["records", "show", "--session", "s1", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("session s1: 2 turns") and "[1] main" in out


def test_cli_reads_while_the_server_writes(run_dir, capsys):
    with Store.open(run_dir / "clawrl.db") as writer:  # the running server
        writer.insert_turn(make_turn("t2", "s1", 2, created_at=30.0))
        assert main(["records", "export", "--run-dir", str(run_dir), "--session", "s1"]) == 0
        assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == ["t0", "t1", "t2"]
        writer.insert_turn(make_turn("t3", "s1", 3, created_at=40.0))
        assert main(["records", "show", "--run-dir", str(run_dir), "--session", "s1"]) == 0
        assert capsys.readouterr().out.startswith("session s1: 4 turns")


@pytest.mark.parametrize("action", [["export"], ["show", "--session", "s1"]])
def test_cli_without_a_database(action, tmp_path, capsys):
    assert main(["records", *action, "--run-dir", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clawrl: error: no clawrl.db in") and "empty" in err
    assert not (tmp_path / "empty").exists()  # reading never creates anything


@pytest.mark.parametrize("action", ["export", "show"])
def test_cli_unknown_session(action, run_dir, capsys):
    assert main(["records", action, "--run-dir", str(run_dir), "--session", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("clawrl: error: no session 'nope'") and captured.out == ""


def test_cli_show_needs_a_session(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["records", "show", "--run-dir", str(run_dir)])
    assert exit_.value.code == 2 and "--session" in capsys.readouterr().err


def test_cli_refuses_unknown_options(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["records", "export", "--run-dir", str(run_dir), "--server.port", "1"])
    assert exit_.value.code == 2 and "--server.port" in capsys.readouterr().err


def test_export_names_each_turns_user_and_takes_one_user(store):
    out = io.StringIO()
    assert export(store, out) == 3
    assert {json.loads(line)["id"]: json.loads(line)["user"] for line in out.getvalue().splitlines()} == {
        "t0": "default",
        "t1": "default",
        "u0": "alice",
    }
    out = io.StringIO()
    assert export(store, out, user="alice") == 1
    assert [json.loads(line)["id"] for line in out.getvalue().splitlines()] == ["u0"]
