"""`clawrl serve` with a trainer group of 2 ranks (accelerate, gloo): versions, /healthz, a killed rank.

As in test_trainer.py, rewards come from explicit ratings, so rated answers are
ready `rl` samples at once; the trainer here is a group launched through
accelerate, rank 0 alone reading the store and publishing.
"""

from __future__ import annotations

import os
import signal
import sqlite3

from tests.conftest import RemoteServer
from tests.service.test_trainer import _load, _number, start_a_step, trained_once
from tests.service.test_trainer import start as start_trainer
from tests.timing import limit, wait_for


def start(run_dir, tiny_model_dir) -> RemoteServer:
    return start_trainer(run_dir, tiny_model_dir, 8, "--train.distributed.num-processes", "2")


def ranks(server) -> list[dict]:
    return server.health()["trainer"].get("ranks", [])


def test_a_rank_killed_mid_step_fails_the_step_and_the_group_is_restarted(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    server = start(run_dir, tiny_model_dir)
    try:
        health = server.health()["trainer"]
        assert health["num_processes"] == 2 and health["status"] == "running"
        group = wait_for(
            lambda: (r := ranks(server)) and all(x["state"] == "waiting" for x in r) and r,
            120,
            "both ranks waiting for samples",
        )
        assert [r["rank"] for r in group] == [0, 1] and group[0]["version"] == server.health()["version"]
        victim = group[1]["pid"]
        published = server.output().count("published v")
        answers = start_a_step(server)  # rank 1 is killed in it
        os.kill(victim, signal.SIGKILL)

        def statuses() -> list[str]:  # the killed step's samples
            db = sqlite3.connect(f"file:{run_dir / 'clawrl.db'}?mode=ro", uri=True)
            marks = ",".join("?" * len(answers))
            sql = f"SELECT status FROM samples WHERE turn_id IN ({marks})"
            rows = db.execute(sql, [r.id for r in answers]).fetchall()
            db.close()
            return [status for (status,) in rows]

        seen, errors = _load(
            server,
            lambda h: h["trainer"]["restarts"] >= 1 and statuses() == ["trained"] * 8,
            timeout=limit(240),
            clients=2,
        )
        assert errors == []  # serving never noticed
        out = server.output()
        assert "a trainer rank failed, the group is stopped: rank 1" in out
        assert "killed by SIGKILL" in out.split("a trainer rank failed")[1].splitlines()[0]
        # The killed step published nothing: the next version came from the restarted group.
        assert out[: out.index("a trainer rank failed")].count("published v") == published
        trainer = server.health()["trainer"]
        assert trainer["last_exit"] == 1 and trainer["status"] == "running"
        after = wait_for(lambda: (r := ranks(server)) and all(x["pid"] for x in r) and r, 60, "new ranks")
        assert victim not in {r["pid"] for r in after}
        trained_once(run_dir)  # every version's samples are `trained`, none in two versions
        wait_for(lambda: _number(server.health()) >= 1, 30, "the server serving the new group's version")
    finally:
        server.stop()
