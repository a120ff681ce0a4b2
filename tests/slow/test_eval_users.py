"""`clawrl eval --users brief,stepwise` end to end on the tiny random model: one real `clawrl serve`
with a users file eval wrote, an adapter per user, both simulated users at once, one step each.

The tiny model learns nothing useful, so this checks the plumbing: each user measured on their own
line of versions through their own key, each user's training turns in their own sessions, each
user's version trained on their own samples alone, the report files valid.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT
from tests.timing import limit

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def eval_out(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("eval-users") / "out"
    command = [
        *CLAWRL, "eval", "--model", str(tiny_model_dir), "--users", "brief,stepwise",
        "--method", "rl", "--steps", "1", "--held-out", "2", "--max-tokens", "24", "--concurrency", "2",
        "--out", str(out), "--train.batch-size", "2", "--judge.backend", "feedback",
        "--stall-s", f"{limit(60):g}", "--train.poll-s", "0.2", "--train.swap-poll-s", "0.2",
        "--train.nice", "0", "--guard.enabled", "false",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=limit(240), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_each_user_is_measured_on_their_own_adapter(eval_out: Path):
    report = json.loads((eval_out / "report.json").read_text())
    assert (
        report["adapters"] == "per_user"
        and report["method"] == "rl"
        and list(report["users"])
        == [
            "brief",
            "stepwise",
        ]
    )
    for name, entry in report["users"].items():
        assert entry["versions"] == ["v0", f"{name}/v1"] and entry["steps"] == [0, 1]
        assert entry["answer_versions"] == [["v0"], [f"{name}/v1"]]
        assert entry["line"] == name and entry["stopped"] == "done" and entry["answers"] >= 2
        assert all(0.0 <= s <= 1.0 for s in entry["scores"])
    table = (eval_out / "report.md").read_text()
    assert "| step | brief | stepwise |" in table and "(brief/v1)" in table and "(stepwise/v1)" in table
    assert (eval_out / "scores.png").read_bytes().startswith(PNG)


def test_each_users_version_is_trained_on_their_own_samples(eval_out: Path):
    run_dir = eval_out / "runs" / "rl-per_user"
    assert stat.S_IMODE((run_dir / "users.json").stat().st_mode) == 0o600
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        turns = list(store.turns())
        for name in ("brief", "stepwise"):
            versions = store.versions(name)
            assert [v.name for v in versions][:2] == ["v0", f"{name}/v1"]
            assert versions[1].metrics["samples"] == 2
            assert store.count_samples(status="trained", users=[name]) >= 2
            mine = [t for t in turns if store.session_user(t.session_id) == name]
            evals = [t for t in mine if "/eval-" in t.session_id]
            assert len(evals) == 2 * 2 and all(t.turn_type == "side" for t in evals)
            assert any(t.turn_type == "main" and "/train-rl-" in t.session_id for t in mine)
        assert {store.session_user(t.session_id) for t in turns} == {"brief", "stepwise"}
        assert store.versions("default")[-1].name == "v0"  # nobody trained the shared line
