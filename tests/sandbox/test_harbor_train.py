"""`clawrl envs train` on Harbor tasks: groups of sandboxed episodes, the verifier's rewards, GRPO,
a published version.

The tasks are made for the test: each one's reference solution is `true` and its verifier
tosses a coin (/dev/urandom), so the rewards of a group differ and GRPO has something to train
on. `--env harbor-solutions:PATH` makes the forced `bash` call the solution (the grammar allows
nothing else), so the tiny random model serving them ends every episode `done` and the
verifier decides: the Harbor path of `envs train` (sandbox, verifier, groups posted, the
trainer's grpo step, a new version) end to end.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT
from tests.timing import limit

pytestmark = pytest.mark.timeout(limit(900))

TASK_TOML = """version = "1.0"

[verifier]
timeout_sec = 30

[agent]
timeout_sec = 60
"""
COIN = "echo $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) > /logs/verifier/reward.txt\n"


def coin_tasks(root: Path, n: int) -> Path:
    for i in range(n):
        task = root / f"coin-{i}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "instruction.md").write_text(f"Toss coin number {i}.\n")
        (task / "task.toml").write_text(TASK_TOML)
        (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + COIN)
        (task / "solution" / "solve.sh").write_text("true\n")
    return root


def test_envs_train_on_harbor_tasks_publishes_a_version_from_the_verifiers_rewards(
    bwrap, tmp_path, tiny_model_dir
):
    tasks, out = coin_tasks(tmp_path / "tasks", 3), tmp_path / "out"
    cmd = [*CLAWRL, "envs", "train", "--env", f"harbor-solutions:{tasks}"]
    cmd += ["--tool-choice", "bash", "--group-size", "4", "--concurrency", "4", "--steps", "1"]
    cmd += ["--max-tokens", "64", "--out", str(out), "--max-wall-s", "600"]
    cmd += ["--model", str(tiny_model_dir), "--model.max-context", "4096", "--train.batch-size", "2"]
    cmd += ["--train.poll-s", "0.2", "--train.swap-poll-s", "0.2", "--train.nice", "0"]
    cmd += ["--guard.enabled", "false", "--judge.enabled", "false"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit(800))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["versions_made"] >= 1 and report["stopped"] == "done"
    totals = report["totals"]
    assert totals["groups_used"] >= 1 and totals["reasons"] == {"done": totals["episodes"]}
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {e["reward"] for e in episodes} == {0.0, 1.0}  # the verifiers' coins, both sides
    with Store.open(out / "run" / "clawrl.db", readonly=True) as store:
        assert [v.name for v in store.versions()][:2] == ["v0", "v1"]
        assert store.count_samples("trained") >= 2
