"""The Harbor harness end to end: every shipped task's reference solution, replayed as the agent's
action through a live server, scores 1 (issue 23's figure, in CI).

`--env harbor-solutions:SET` offers the `bash` tool with one allowed command, the task's
solve.sh (a JSON-schema const); `--tool-choice bash` forces the call, so the served model decodes
it under that grammar like any forced call, the gateway records the turn, the tool runs in the
sandbox, and the verifier scores the workspace. A tiny random model serves (the grammar decides
every token); its window is scaled to 4,096 tokens so a task's instruction and tool fit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clawrl.envs.harbor.env import rows
from clawrl.envs.load import harbor_path
from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT, RemoteServer
from tests.timing import limit


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, bwrap):
    run_dir = tmp_path_factory.mktemp("solutions") / "run"
    s = RemoteServer(run_dir, ["--model", str(tiny_model_dir), "--model.max-context", "4096"])
    yield s
    s.stop()


@pytest.mark.parametrize("name", ["terminal", "repository"])
def test_every_reference_solution_replayed_through_the_gateway_scores_1(server, tmp_path, name):
    out = tmp_path / "out"
    cmd = [*CLAWRL, "envs", "eval", "--env", f"harbor-solutions:{name}"]
    cmd += ["--split", "all", "--tool-choice", "bash", "--base-url", server.url + "/v1", "--out", str(out)]
    done = subprocess.run(
        cmd + ["--concurrency", "2"], cwd=ROOT, capture_output=True, text=True, timeout=limit(900)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    tasks = {row["id"]: row for row in rows(harbor_path(name))}
    assert sorted(e["task"] for e in episodes) == sorted(tasks)  # every task of the set, once
    failed = [(e["task"], e["reward"], e["reason"]) for e in episodes if e["reward"] != 1.0]
    assert not failed, failed
    assert all(e["reason"] == "done" and e["tool_calls"] == 1 for e in episodes)
    # The recorder kept each forced call as a turn: the solution's text, decoded under the grammar.
    sessions = {e["session_id"]: e["task"] for e in episodes}
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        turns = [t for t in store.turns() if t.session_id in sessions]
    assert len(turns) == len(episodes)
    for turn in turns:
        solve = Path(tasks[sessions[turn.session_id]]["task_dir"]) / "solution" / "solve.sh"
        (call,) = turn.tool_calls
        assert call["function"]["name"] == "bash" and turn.grammar is not None
        assert json.loads(call["function"]["arguments"]) == {"command": solve.read_text()}
