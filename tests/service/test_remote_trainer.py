"""A trainer on "another host": `clawrl train --server URL` in a run folder that shares no file with
its gateway's (`clawrl serve --train.enabled false`), connected over loopback only. It claims,
reports and publishes through the gateway's API (clawrl/train/remote/); the gateway alone opens
`clawrl.db`. Rewards come from explicit ratings (judge backend `feedback`): every rated answer is a
ready `rl` sample at once. A trainer with a wrong key exits 2 here; what the gateway does with it
(401, nothing claimed), a garbled upload, the lease taken and run out and a trainer cut off are
tested in-process: tests/unit/test_remote_trainer.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx

from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT, RemoteServer
from tests.timing import limit, wait_for

KEY = "sk-remote-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
BATCH = 4


class Trainer:
    """`clawrl train --server URL` in `run_dir`, the admin key from $CLAWRL_API_KEY."""

    def __init__(self, run_dir: Path, url: str, model: Path, key: str = KEY) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True)
        self.out = run_dir.parent / f"{run_dir.name}.out"
        cmd = [*CLAWRL, "train", "--server", url, "--run-dir", str(run_dir), "--model", str(model)]
        cmd += ["--method", "rl", "--train.batch-size", str(BATCH), "--train.poll-s", "0.2"]
        cmd += ["--train.nice", "0", "--guard.enabled", "false"]
        with open(self.out, "w") as out:
            env = {**os.environ, "CLAWRL_API_KEY": key}
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def output(self) -> str:
        return self.out.read_text()

    def pid(self) -> int:
        """Its own pid, as it wrote it in its run folder's lock (`proc` may be a stand-in: tests/preload)."""
        lock = self.run_dir / "trainer.lock"
        return int(wait_for(lambda: lock.is_file() and lock.read_text().strip(), 60, "the trainer's lock"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(limit(60))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rate_a_batch(server: RemoteServer, round_: int) -> None:
    """BATCH answers from the openai client, each rated up: BATCH ready samples."""
    client = server.client(api_key=KEY)
    for n in range(BATCH):
        r = client.chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": f"round {round_}, {n}"}], max_tokens=24
        )
        httpx.post(
            server.url + "/v1/feedback", json={"response_id": r.id, "rating": 1}, headers=AUTH
        ).raise_for_status()


def counts(run_dir: Path) -> dict[str, int]:
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        return {s: store.count_samples(s) for s in ("ready", "training", "trained")}


def latest(run_dir: Path):
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        return store.latest_version()


def test_a_remote_trainer_is_served_and_one_killed_mid_step_loses_no_sample(tmp_path, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--judge.backend", "feedback", "--method", "rl"]
    args += ["--train.batch-size", str(BATCH), "--train.swap-poll-s", "0.2", "--train.lease-s", "3"]
    gateway = RemoteServer(tmp_path / "gateway" / "run", args, env={"CLAWRL_API_KEY": KEY})
    run = gateway.run_dir
    first = second = None
    try:
        assert gateway.health()["trainer"]["status"] == "off"  # none of its own, no remote one yet
        wrong = Trainer(tmp_path / "trainer-host" / "wrong", gateway.url, tiny_model_dir, key="sk-not-it")
        assert wrong.proc.wait(limit(120)) == 2 and "(401)" in wrong.output()
        assert gateway.health()["trainer"]["status"] == "off"  # it took no lease
        first = Trainer(tmp_path / "trainer-host" / "first", gateway.url, tiny_model_dir)
        rate_a_batch(gateway, 1)
        wait_for(lambda: gateway.health()["version"] == "v1", 180, "v1, trained remotely, served")
        answer = gateway.client(api_key=KEY).chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "and now?"}], max_tokens=4
        )
        assert answer.system_fingerprint == "clawrl-v1"
        trainer = gateway.health()["trainer"]
        assert trainer["status"] == "remote" and trainer["remote"].split(":")[1] == str(first.pid())
        v1 = latest(run)
        assert v1.path == str(run / "checkpoints" / "v1") and (Path(v1.path) / "manifest.json").is_file()
        assert not (first.run_dir / "clawrl.db").exists()  # the trainer never opened a store
        assert (first.run_dir / "checkpoints" / "v1" / "manifest.json").is_file()

        # Killed mid-step: frozen as soon as it holds a batch, checked, then SIGKILLed.
        pid = first.pid()
        rate_a_batch(gateway, 2)
        wait_for(lambda: counts(run)["training"] == BATCH, 120, "a claimed batch", every=0.01)
        os.kill(pid, signal.SIGSTOP)
        assert counts(run)["training"] == BATCH and latest(run).name == "v1", "the step had finished"
        os.kill(pid, signal.SIGKILL)
        first.proc.wait(limit(30))
        wait_for(lambda: counts(run)["ready"] == BATCH, 60, "the killed trainer's claims back in the queue")
        assert "was not heard from for 3 s" in gateway.output()

        # Another trainer, in an empty run folder: it downloads v1 and trains the batch from it.
        second = Trainer(tmp_path / "trainer-host" / "second", gateway.url, tiny_model_dir)
        wait_for(lambda: latest(run).name == "v2", 180, "v2, trained by the second trainer")
        assert latest(run).parent == "v1" and "downloaded v1" in second.output()
        assert counts(run) == {"ready": 0, "training": 0, "trained": 2 * BATCH}  # none lost, none twice
        trained = [
            json.loads((run / "checkpoints" / v / "manifest.json").read_text())["samples"]
            for v in ("v1", "v2")
        ]
        assert len(set(trained[0] + trained[1])) == 2 * BATCH
        wait_for(lambda: gateway.health()["version"] == "v2", 60, "v2 served")
    finally:
        for trainer in (first, second):
            if trainer is not None:
                trainer.stop()
        gateway.stop()
