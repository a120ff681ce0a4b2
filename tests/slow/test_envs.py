"""`clawrl envs` end to end: train (grpo) and eval through real servers and a real trainer.

On the tiny random model, a TRL-style coin environment whose reward depends on the side the
model picks (the forced call's grammar makes it pick one of the two): `envs train` runs groups
until the trainer publishes a version, then `envs eval` measures v0 and v1, each served by a
server of its own (v0 the run's base as it names it, v1 exported first). The tiny model learns
nothing useful; this checks the plumbing and the bookkeeping (groups used, versions counted, the
report files).

(`envs eval --base-url` on the embedded model, a calculator episode: tests/slow/test_embedded.py,
on that module's server.)
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT
from tests.timing import limit

# A trainer, exports and several servers on a 2-core CPU: minutes, more on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(limit(1200))]
PNG = b"\x89PNG\r\n\x1a\n"

COIN_ENV = '''
class CoinEnv:
    def __init__(self):
        self.side = None

    def reset(self, **row):
        self.side = None

    def pick(self, side: str) -> str:
        """
        Pick a side of the coin.

        Args:
            side: The side to pick (choices: ["heads", "tails"])
        """
        self.side = side
        self.done = True
        return "picked " + side

    def get_reward(self) -> float:
        return 1.0 if self.side == "heads" else 0.0
'''


def clawrl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLAWRL, *args],
        capture_output=True,
        text=True,
        timeout=limit(timeout),
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def coin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("coin")
    (folder / "coin_env.py").write_text(textwrap.dedent(COIN_ENV))
    (folder / "tasks.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Toss {i}."}) + "\n" for i in range(3))
    )
    return folder


@pytest.fixture(scope="module")
def trained(coin: Path, tiny_model_dir: Path) -> Path:
    out = coin / "out"
    done = clawrl(
        "envs", "train", "--env", f"{coin / 'coin_env.py'}:CoinEnv", "--tasks", str(coin / "tasks.jsonl"),
        "--tool-choice", "pick", "--group-size", "4", "--concurrency", "4", "--steps", "1",
        "--max-tokens", "32",
        "--out", str(out), "--model", str(tiny_model_dir), "--max-wall-s", "300",
        "--train.batch-size", "2", "--train.poll-s", "0.2", "--train.swap-poll-s", "0.2", "--train.nice", "0",
        "--guard.enabled", "false", "--judge.enabled", "false",
        # the eval below measures v1: the trainer may publish past it before the run stops, and the
        # default retention (train.keep_versions, the newest two) would prune v1's adapter
        "--train.keep-versions", "8",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return out


def test_envs_train_runs_groups_until_the_trainer_publishes(trained: Path):
    report = json.loads((trained / "report.json").read_text())
    assert report["mode"] == "train" and report["env"] == "coin_env:CoinEnv"
    assert report["start"] == "v0" and report["versions_made"] >= 1 and report["stopped"] == "done"
    assert report["config"]["method"] == "grpo" and report["settings"]["schedule"] == "pick"
    totals = report["totals"]
    assert totals["groups_used"] >= 1 and totals["unanswered"] == 0 and totals["post_errors"] == []
    assert totals["reasons"] == {"done": totals["episodes"]}  # every episode picked a side
    assert (trained / "report.png").read_bytes().startswith(PNG)
    lines = [json.loads(line) for line in (trained / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == totals["episodes"] and {line["reward"] for line in lines} <= {0.0, 1.0}
    with Store.open(trained / "run" / "clawrl.db", readonly=True) as store:
        assert [v.name for v in store.versions()][:2] == ["v0", "v1"]
        groups = {line["group_id"] for line in lines}
        assert {store.group(g).status for g in groups} <= {"used", "dropped"}


def _versions(run: Path) -> list[str]:
    with Store.open(run / "clawrl.db", readonly=True) as store:
        return [v.name for v in store.versions()]


def test_envs_eval_measures_each_version_on_a_server_of_its_own(trained: Path, coin: Path):
    out = coin / "eval"
    before = _versions(trained / "run")
    done = clawrl(
        "envs", "eval", "--env", f"{coin / 'coin_env.py'}:CoinEnv", "--tasks", str(coin / "tasks.jsonl"),
        "--tool-choice", "pick", "--max-tokens", "32", "--run-dir", str(trained / "run"),
        "--versions", "v0,v1",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [row["version"] for row in report["versions"]] == ["v0", "v1"]
    assert all(row["episodes"] == 3 and row["dropped"] == 0 for row in report["versions"])
    assert report["settings"]["temperature"] == 0.0 and "v1: success" in done.stdout
    for version in ("v0", "v1"):  # each version served by its own server, its episodes posted as eval ones
        with Store.open(out / "servers" / version / "clawrl.db", readonly=True) as store:
            assert len(list(store.turns())) == 3
    assert _versions(trained / "run") == before  # the run was only read
