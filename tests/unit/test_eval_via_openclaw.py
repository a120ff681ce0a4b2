"""`clawrl eval --via openclaw`: what each call's openclaw.json says (the live agent: tests/client)."""

from __future__ import annotations

import sys
from pathlib import Path

from clawrl.eval.openclaw import run_agent
from clawrl.eval.via_openclaw import session_config


def _provider(config: dict) -> dict:
    return config["models"]["providers"]["clawrl"]


def test_a_training_turn_leaves_sampling_to_openclaw_and_names_its_session():
    config = session_config(
        "http://127.0.0.1:1/v1", "k3y", Path("/w"), "train-rl-00001-m03", 1.0, 128, False, False
    )
    provider = _provider(config)
    assert provider["headers"] == {"X-Session-Id": "train-rl-00001-m03", "X-Turn-Type": "main"}
    assert provider["apiKey"] == "k3y" and provider["models"][0]["maxTokens"] == 128
    assert "models" not in config["agents"]["defaults"]  # no temperature: the model's own defaults
    assert config["agents"]["defaults"]["workspace"] == "/w"


def test_a_held_out_answer_is_a_greedy_side_turn_that_ends_its_session():
    config = session_config("http://127.0.0.1:1/v1", None, Path("/w"), "eval-v0-v1-m07", 0.0, 64, True, True)
    assert _provider(config)["headers"] == {
        "X-Session-Id": "eval-v0-v1-m07", "X-Turn-Type": "side", "X-Session-Done": "true",
    }  # fmt: skip
    assert config["agents"]["defaults"]["models"]["clawrl/clawrl"]["params"] == {"temperature": 0.0}
    assert _provider(config)["apiKey"] == "unused"


def test_a_held_out_answer_asks_for_memory_or_refuses_it_in_a_header():
    """On a server with memory on, each held-out task is answered twice: with the block (a side turn
    must ask for it) and without (docs/evaluation.md, "With memory")."""
    url, where, session = "http://127.0.0.1:1/v1", Path("/w"), "eval-v0-v1-m07"
    asked = session_config(url, None, where, session, 0.0, 64, True, True, memory=True)
    refused = session_config(url, None, where, session, 0.0, 64, True, True, memory=False)
    assert _provider(asked)["headers"]["X-Memory"] == "on"
    assert _provider(refused)["headers"]["X-Memory"] == "off"
    default = session_config(url, None, where, session, 0.0, 64, True, True)
    assert "X-Memory" not in _provider(default)["headers"]


def test_a_relative_out_folder_gives_the_agent_its_home_as_an_absolute_path(tmp_path, monkeypatch):
    """`clawrl eval --via openclaw --out oc-out` (a relative folder): the agent runs in the workspace,
    so a relative HOME would name a folder with no openclaw.json and OpenClaw would fall back to its
    own default model (seen 2026-11-26: every turn "No route-compatible authentication source")."""
    agent = tmp_path / "openclaw"  # prints the HOME and folder it was started with, as a turn's text
    agent.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        'print(json.dumps({"payloads": [{"text": os.environ["HOME"] + "|" + os.getcwd()}], "meta": {}}))\n'
    )
    agent.chmod(0o755)
    (tmp_path / "out" / "home").mkdir(parents=True)
    (tmp_path / "workspace").mkdir()
    monkeypatch.chdir(tmp_path)
    turn = run_agent(agent, Path("out/home"), "s1", "hi", timeout=60, cwd=Path("workspace"))
    home, cwd = turn.text.split("|")
    assert Path(home) == tmp_path / "out" / "home" and Path(cwd) == tmp_path / "workspace"


def test_each_version_answers_a_held_out_task_under_the_same_openclaw_session_id(tmp_path):
    """OpenClaw writes its session id into the prompt (`Runtime: ... sessionId=...`), which the model
    reads: seen 2026-11-27, a 135M model answering "eval_v0-v0-m37" code. A held-out task is asked
    under one OpenClaw session id at every version, each time in a fresh HOME (no history carried
    over), while the server files it under the eval's own session; a training turn keeps its id."""
    import asyncio

    from clawrl.eval.via_openclaw import OpenClawClient

    agent = tmp_path / "openclaw"  # answers with the session id and HOME it was started with
    agent.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        'sid = sys.argv[sys.argv.index("--session-id") + 1]\n'
        'print(json.dumps({"payloads": [{"text": sid + "|" + os.environ["HOME"]}], "meta": {}}))\n'
    )
    agent.chmod(0o755)
    client = OpenClawClient("http://127.0.0.1:1", None, agent, tmp_path / "out")
    recorded: dict[str, int] = {}

    async def turns(session_id: str) -> list[dict]:  # the server's record: one more turn per call
        n = recorded[session_id] = recorded.get(session_id, -1) + 1
        kind = "side" if session_id.startswith("eval-") else "main"
        return [{"id": f"{session_id}-{i}", "type": kind, "versions": ["v1"]} for i in range(n)]

    client._turns = turns  # type: ignore[method-assign]
    client._reasoning = False  # the model card's answer: no server behind this client

    async def ask(session: str, side: bool) -> str:
        answer = await client.chat(
            [{"role": "user", "content": "What is 2 + 3?"}], session, temperature=0.0 if side else 1.0,
            max_tokens=8, side=side, done=True,
        )  # fmt: skip
        return answer.text

    v1, v2, train = (
        asyncio.run(ask(s, s.startswith("eval-"))) for s in ("eval-v0-v1-m07", "eval-v0-v2-m07", "train-1")
    )
    (id1, home1), (id2, home2) = v1.split("|"), v2.split("|")
    assert id1 == id2 and "v1" not in id1 and "v2" not in id1 and home1 != home2
    assert train.split("|")[0] == "train-1"
