"""The preloader (clawrl/cli/preload.py, clawrl/forked.py): `clawrl` commands forked from a
pre-imported process behave as the same commands started afresh, and what it cannot run as
such is left to a fresh interpreter.

Each test starts its own preloader with one OpenMP thread (it forks only while it is a single
thread, which torch's import leaves it only then; scripts/test sets it for the whole suite).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clawrl.forked import ENV, ForkedProcess, spawn
from clawrl.launcher import ServerProcess
from clawrl.store.db import Store
from clawrl.testing import preloaded
from tests.conftest import CLAWRL
from tests.timing import limit, wait_for


@pytest.fixture(scope="module")
def preloader(tmp_path_factory):
    """One preloader for the module, with one OpenMP thread, named in $CLAWRL_PRELOAD meanwhile."""
    log = tmp_path_factory.mktemp("preload") / "preload.log"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        with preloaded(log, timeout_s=limit(300)) as path:
            yield path, log


def _fresh_and_forked(argv: list[str], cwd: Path) -> tuple[tuple[int, str], tuple[int, str]]:
    command = [sys.executable, "-m", "clawrl", *argv]
    fresh = _run(command[2:], cwd)
    out = cwd / "forked.out"
    with open(out, "w") as f:
        proc = spawn(command, os.environ, cwd, f)
    assert isinstance(proc, ForkedProcess)
    code = proc.wait(limit(120))
    return (fresh.returncode, fresh.stdout + fresh.stderr), (code, out.read_text())


def test_a_forked_command_prints_and_exits_as_the_same_command_started_afresh(preloader, tmp_path):
    """Output, exit status, working folder (a relative run folder), arguments: the same."""
    with Store.open(tmp_path / "run" / "clawrl.db"):
        pass  # an empty run, found only from the right folder
    for argv in (["versions", "--run-dir", "run"], ["versions", "--run-dir", "nowhere"], ["--help"]):
        fresh, forked = _fresh_and_forked(argv, tmp_path)
        assert forked == fresh, argv
    assert fresh[0] == 0 and "usage: clawrl" in fresh[1]


def test_a_server_forked_by_the_launcher_is_a_server_of_its_own(preloader, tmp_path, tiny_model_dir):
    """Its environment (the API key), its own random seeds, its pid to signal, its exit status."""
    args = ["--model", str(tiny_model_dir)]
    servers: list[ServerProcess] = []
    try:
        for i in range(2):
            servers.append(
                ServerProcess(tmp_path / f"run{i}", args, env={"CLAWRL_API_KEY": "k"}, off=("train", "guard"))
            )
        assert all(isinstance(s.proc, ForkedProcess) for s in servers)
        assert httpx.get(servers[0].url + "/v1/models", timeout=limit(30)).status_code == 401
        texts = []
        for server in servers:  # the same request, unseeded: a fresh interpreter's draws each
            reply = server.client("k").chat.completions.create(
                model="clawrl", messages=[{"role": "user", "content": "Say anything."}],
                temperature=1.0, max_tokens=12,
            )  # fmt: skip
            texts.append(reply.choices[0].message.content)
        assert texts[0] != texts[1]
        first, second = (s.proc for s in servers)
        with pytest.raises(subprocess.TimeoutExpired):
            first.wait(0.2)
        first.send_signal(signal.SIGKILL)
        assert first.wait(limit(60)) == -signal.SIGKILL
        servers[1].stop()  # SIGTERM, as to a server started afresh
        assert second.returncode == -signal.SIGTERM
        assert not Path(f"/proc/{second.pid}").exists()  # reaped, by the preloader's waiter
    finally:
        for server in servers:
            server.stop()


def test_what_a_fork_cannot_honour_starts_afresh(preloader, monkeypatch, tmp_path, tiny_model_dir):
    """An import-time variable that differs (OpenMP's threads), a command not clawrl's, a preloader
    gone: the launcher starts a fresh interpreter, and the preloader says why it refused."""
    path, log = preloader
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with open(tmp_path / "out", "w") as f:
        assert spawn([sys.executable, "-m", "clawrl", "--help"], os.environ, tmp_path, f) is None
        assert spawn([sys.executable, "-c", "print(1)"], os.environ, tmp_path, f) is None
    assert "import-time environment differs" in log.read_text()
    with ServerProcess(tmp_path / "run", ["--model", str(tiny_model_dir)], off=("train", "guard")) as server:
        assert isinstance(server.proc, subprocess.Popen)
    monkeypatch.setenv(ENV, str(tmp_path / "no-such-socket"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with open(tmp_path / "out", "w") as f:
        assert spawn([sys.executable, "-m", "clawrl", "--help"], os.environ, tmp_path, f) is None


def test_a_forked_trainer_leaves_with_its_server(preloader, tmp_path, tiny_model_dir):
    """The server's trainer is forked too, so it is not the server's child: it watches the server's
    pid (`exit_watch`), and a SIGKILLed server leaves no trainer behind, as without the preloader."""
    args = ["--model", str(tiny_model_dir), "--train.nice", "0"]
    with ServerProcess(tmp_path / "run", args, off=("guard",)) as server:
        trainer = wait_for(lambda: server.health()["trainer"]["pid"], 120, "the trainer running")
        assert "clawrl.cli.preload" in Path(f"/proc/{trainer}/cmdline").read_text()
        server.proc.kill()
        assert server.proc.wait(limit(60)) == -signal.SIGKILL
        wait_for(lambda: not Path(f"/proc/{trainer}").exists(), 60, "the trainer gone with its server")


def test_a_stand_in_runs_the_command_forked_as_if_it_were_the_command(preloader, tmp_path, tiny_model_dir):
    """`python -m clawrl.forked clawrl ...` (how torch's elastic agent starts a trainer group's
    ranks): the command forked, its stdout and stderr apart and its exit status the stand-in's;
    a signal to the stand-in is passed on and ends it as it ended the command; the stand-in
    SIGKILLed (the agent's last resort) takes the command with it."""
    for argv in (["versions", "--run-dir", "nowhere"], ["--help"]):
        fresh, stood = _run(["clawrl", *argv], tmp_path), _run(["clawrl.forked", "clawrl", *argv], tmp_path)
        seen = [(p.returncode, p.stdout, p.stderr) for p in (fresh, stood)]
        assert seen[1] == seen[0], argv
    assert fresh.returncode == 0 and "usage: clawrl" in fresh.stdout and stood.stderr == ""
    # A signal to the stand-in, and a command killed (a rank SIGKILLed: its group sees it so).
    for to, sig in (("stand-in", signal.SIGTERM), ("stand-in", signal.SIGKILL), ("command", signal.SIGKILL)):
        run_dir = tmp_path / f"run-{to}-{sig.name}"
        run_dir.mkdir()
        pid, stand_in = _waiting_trainer(run_dir, tiny_model_dir)
        try:
            assert pid != stand_in.pid and "clawrl.cli.preload" in Path(f"/proc/{pid}/cmdline").read_text()
            os.kill(stand_in.pid if to == "stand-in" else pid, sig)
            assert stand_in.wait(limit(60)) == -sig, (to, sig)
            gone = lambda p=pid: not Path(f"/proc/{p}").exists()  # noqa: E731
            wait_for(gone, 60, f"the trainer gone ({to}, {sig.name})")
        finally:
            stand_in.kill()
            stand_in.wait()


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=limit(120))


def _waiting_trainer(run_dir: Path, model: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """`clawrl train` through its stand-in on a run with no samples: it waits, holding the run's
    lock, which names its pid. (The pid, the stand-in.)"""
    lock = run_dir / "trainer.lock"
    trainer = [*CLAWRL, "train", "--run-dir", str(run_dir), "--model", str(model)]
    stand_in = subprocess.Popen(trainer, cwd=run_dir)
    pid = wait_for(lambda: lock.is_file() and lock.read_text().strip(), 120, "the trainer holding its run")
    return int(pid), stand_in
