"""The trainer process beside a live server: versions published under load, crashes, resume.

Rewards come from explicit ratings (`POST /v1/feedback`, judge backend
`feedback`), so every rated answer becomes a ready `rl` sample at once and the
real trainer subprocess turns them into versions while clients keep streaming.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clawrl.store.db import Store
from tests.conftest import CLAWRL, RemoteServer
from tests.timing import limit, wait_for


def start(run_dir, tiny_model_dir, batch_size: int, *more: str) -> RemoteServer:
    return RemoteServer(
        run_dir,
        [
            "--model",
            str(tiny_model_dir),
            "--train.enabled",
            "true",
            "--judge.backend",
            "feedback",
            "--method",
            "rl",
            "--train.batch-size",
            str(batch_size),
            "--train.poll-s",
            "0.2",
            "--train.swap-poll-s",
            "0.2",
            "--train.restart-backoff-s",
            "0.5",
            # By default the trainer is niced so serving keeps the CPU; under this test's
            # constant load it would then get ~5% of a 2-core machine and take minutes.
            "--train.nice",
            "0",
            *more,
        ],
    )


def start_a_step(server, batch_size: int = 8) -> list:
    """Ask `batch_size` answers, then rate them all at once (one full batch); return the answers
    as soon as the server's log shows the trainer started a step on them."""
    client = server.client()
    answers = [
        client.chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": f"more {n}"}], max_tokens=48
        )
        for n in range(batch_size)
    ]
    started = server.output().count(": training v")
    for r in answers:
        httpx.post(server.url + "/v1/feedback", json={"response_id": r.id, "rating": 1}).raise_for_status()
    wait_for(lambda: server.output().count(": training v") > started, 60, "a step started", every=0.01)
    return answers


async def _client(server, i: int, stop: asyncio.Event, seen: list, errors: list, max_tokens: int) -> None:
    """Stream bounded requests and rate each answer, as a user with thumbs up/down would."""
    client = server.async_client()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for n in range(60):
            if stop.is_set():
                return
            try:
                stream = await client.chat.completions.create(
                    model="clawrl",
                    messages=[{"role": "user", "content": f"client {i} question {n}"}],
                    max_tokens=max_tokens,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                chunks = [c async for c in stream]
                seen.append({c.system_fingerprint for c in chunks})
                rating = {"response_id": chunks[0].id, "rating": 1 if n % 2 else -1}
                (await http.post("/v1/feedback", json=rating)).raise_for_status()
            except Exception as exc:  # every failure is counted and reported by the test
                errors.append(repr(exc))


async def _until(server, done, timeout: float, stop: asyncio.Event) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as http:
        while not done((await http.get(server.url + "/healthz")).json()):
            assert time.monotonic() < deadline, f"not reached within {timeout} s:\n{server.output()[-3000:]}"
            await asyncio.sleep(0.1)
    stop.set()


def _load(server, done, timeout: float, max_tokens: int = 16, clients: int = 8):
    seen: list[set] = []
    errors: list[str] = []

    async def scenario():
        stop = asyncio.Event()
        streams = [_client(server, i, stop, seen, errors, max_tokens) for i in range(clients)]
        await asyncio.gather(_until(server, done, timeout, stop), *streams)

    asyncio.run(scenario())
    return seen, errors


def _number(health: dict) -> int:
    return int(health["version"].removeprefix("v"))


def manifests(run_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "checkpoints").glob("v*/manifest.json"))]


def trained_once(run_dir) -> list[list[int]]:
    """Every published version's manifest samples; asserts no sample is in two of them, and that
    they, and no other, are `trained`. The trainer runs on meanwhile: the versions are read between
    two equal counts of trained samples, so that none was published in between (a checkpoint
    folder is written before its version is published: a folder alone is not a version yet)."""
    for _ in range(100):
        with Store.open(run_dir / "clawrl.db", readonly=True) as store:
            count = store.count_samples("trained")
            published = [v for v in store.versions() if v.name != "v0"]
            used = [json.loads((Path(v.path) / "manifest.json").read_text())["samples"] for v in published]
            flat = [i for ids in used for i in ids]
            statuses = {store.sample_status(i)[0] for i in flat}
            if store.count_samples("trained") == count:
                break
    assert len(flat) == len(set(flat)), "a sample was trained twice"
    assert statuses <= {"trained"}, statuses
    assert count == len(flat)
    return used


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A server and its trainer for the tests below that only read what it does (one start)."""
    server = start(tmp_path_factory.mktemp("trained") / "run", tiny_model_dir, batch_size=4)
    yield server
    server.stop()


def test_versions_published_by_the_trainer_swap_in_under_eight_streaming_clients(trained):
    server, run_dir = trained, trained.run_dir
    seen, errors = _load(server, lambda h: _number(h) >= 3, timeout=180)
    assert errors == []
    # The server swaps in the latest version: two published back to back may be served as one swap.
    fingerprints = set().union(*seen) - {"clawrl", "clawrl-v0"}
    assert len(fingerprints) >= 2, fingerprints
    health = server.health()
    assert health["trainer"]["status"] == "running" and health["trainer"]["restarts"] == 0
    used = trained_once(run_dir)
    assert len(used) >= 3 and all(len(ids) == 4 for ids in used)
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        served = {v for turn in store.turns() for v in turn.versions}
    assert "v0" in served and len(served - {"v0"}) >= 2, served
    assert "published v3 (step 3)" in server.output()  # the trainer's progress reaches the server log


def test_a_trainer_killed_mid_step_is_restarted_and_resumes_without_reusing_a_sample(
    tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "run"
    server = start(run_dir, tiny_model_dir, batch_size=8)
    try:
        start_a_step(server)  # v1 first, so that the step count must carry over the restart
        wait_for(lambda: _number(server.health()) >= 1, 180, "v1 served")
        pid = server.health()["trainer"]["pid"]
        start_a_step(server)  # the trainer is killed in it
        published = server.output().count("published v")
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert server.output().count("published v") == published, "the step had finished: not killed mid-step"
        before = _number(server.health())
        seen, errors = _load(
            server,
            lambda h: h["trainer"]["restarts"] >= 1 and _number(h) >= before + 1,  # one step after it
            timeout=180,
            clients=2,
        )
        assert errors == []  # serving never noticed
        trainer = server.health()["trainer"]
        assert trainer["last_exit"] == -signal.SIGKILL and trainer["status"] == "running"
        assert trainer["last_error"] == "killed by SIGKILL"
        assert trainer["pid"] != pid
        assert "training from v" in server.output().split("restarting in")[-1]  # it resumed from a version
        trained_once(run_dir)
        steps = [
            json.loads(p.read_text())["step"] for p in (run_dir / "checkpoints").glob("v*/manifest.json")
        ]
        assert sorted(steps) == list(range(1, len(steps) + 1))  # the step count carried over the restart
        # Both trainer lives appended to one metrics.jsonl: each published step once, the killed one never.
        logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert logged == list(range(1, len(logged) + 1)) and len(logged) >= len(steps) - 1
        metrics = {
            (s.name, tuple(s.labels.items())): s.value
            for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
            for s in family.samples
        }
        assert metrics["clawrl_trainer_restarts_total", ()] == 1
        assert metrics["clawrl_trainer_status", (("status", "running"),)] == 1
        assert metrics["clawrl_versions_published_total", ()] >= len(steps)
    finally:
        server.stop()


def test_a_second_trainer_on_the_same_run_folder_is_refused(trained):
    lock = trained.run_dir / "trainer.lock"
    pid = wait_for(lambda: lock.is_file() and lock.read_text().strip(), 60, "the trainer holding the folder")
    cmd = [*CLAWRL, "train", "--run-dir", str(trained.run_dir)]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=limit(120))
    assert second.returncode == 3
    # The trainer's own pid (the server's child, or the process its stand-in holds: tests/preload).
    assert f"another trainer (pid {pid})" in second.stderr
