"""The canary gate beside a live server: a version that forgets is held and never served.

The tiny random model answers almost uniformly, so no learning rate moves it as
far as a real model moves when it forgets; the test makes the break deliberate
(learning rate 0.5) and the KL limit tight (0.01 nats/token), so the trainer's
real canary measures the step and holds it. What a user sees is what is checked:
the served version, every answer's fingerprint, `/healthz`, `clawrl versions`
and the logs.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest

from clawrl.store.db import Store
from tests.conftest import CLAWRL
from tests.service.test_trainer import start, start_a_step
from tests.timing import limit, wait_for


@pytest.mark.parametrize("ranks", [1, 2], ids=["one-process", "two-ranks"])
def test_a_deliberately_broken_version_is_held_never_served_and_training_restarts_from_v0(
    tmp_path, tiny_model_dir, ranks
):
    """With two ranks, rank 0 checks and publishes, and both go back to v0 after the hold."""
    run_dir = tmp_path / "run"
    gate = ["--guard.enabled", "true", "--guard.max-kl", "0.01", "--train.lr", "0.5"]
    gate += ["--train.distributed.num-processes", str(ranks)]
    server = start(run_dir, tiny_model_dir, 4, *gate)
    try:
        start_a_step(server, batch_size=4)
        store = Store.open(run_dir / "clawrl.db", readonly=True)
        wait_for(lambda: len(store.versions()) >= 2, 120, "v1 published")
        v1 = store.versions()[1]
        assert v1.held and "KL(base || version)" in v1.canary["reason"], v1
        assert v1.canary["kl"] > 0.01 and v1.canary["kl_tokens"] > 0 and v1.canary["seconds"] > 0

        wait_for(lambda: server.health()["guard"]["held_versions"] == 1, 60, "/healthz shows the hold")
        guard = server.health()["guard"]
        assert guard["status"] == "on" and guard["last_held"]["version"] == "v1"
        assert guard["last_check"]["version"] == "v1" and guard["last_check"]["status"] == "held"
        assert 0 <= guard["last_check"]["accuracy"] <= 1 and guard["max_accuracy_drop"] > 0
        assert guard["hold_on_collapse"] is False and guard["collapse_max_drift"] == 2.0
        assert "not serving v1: the canary gate held it" in server.output()

        def dashboard_v1() -> dict | None:  # the dashboard's snapshot is cached for a second
            state = httpx.get(server.url + "/dashboard/state.json", timeout=limit(30)).json()
            return {v["name"]: v for v in (state["store"] or {}).get("versions", [])}.get("v1")

        wait_for(lambda: dashboard_v1() is not None, 30, "v1 on the dashboard")
        shown = dashboard_v1()
        assert shown["status"] == "held" and "KL(base || version)" in shown["canary"]["reason"]
        # the collapse column's figures (its drift off 0: the broken step moved the probes' logprobs)
        collapse = shown["canary"]["collapse"]
        assert {"entropy_ratio", "self_rouge_l", "crossed"} <= set(collapse) and collapse["drift"] > 0

        # Never served: the engine stays on v0, and so does every answer after the hold.
        answer = server.client().chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "after"}], max_tokens=8
        )
        assert server.health()["version"] == "v0" and answer.system_fingerprint == "clawrl-v0"

        # The trainer goes back to v0 (weights and optimizer) and trains the next batch from there.
        start_a_step(server, batch_size=4)
        wait_for(lambda: len(store.versions()) >= 3, 120, "v2 published")
        assert "v1 is held; training on from v0" in server.output()
        assert store.versions()[2].parent == "v0"
        with store:
            served = {v for turn in store.turns() for v in turn.versions}
        assert served == {"v0"}, served

        listing = subprocess.run(
            [*CLAWRL, "versions", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert "| HELD: canary" in listing[1] and "KL(base || version)" in listing[1], listing
    finally:
        server.stop()
