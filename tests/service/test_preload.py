"""The suite's preloader (tests/preload): a `python -m clawrl ...` started with its environment is
forked from a pre-imported process and behaves as the same command started afresh, through a
stand-in that its starter holds; what it cannot run as such runs in its own interpreter.

The module uses the worker's preloader where the suite started one (scripts/test's workers), else
starts its own, with one OpenMP thread either way (it forks only while it is a single thread, which
torch's import leaves it only then), and puts its environment in this process's for each test, as
tests/conftest.py does for the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clawrl.launcher import ServerProcess
from clawrl.store.db import Store
from tests.conftest import CLAWRL, PRELOADER
from tests.preload import SOCKET_ENV, Preloader
from tests.timing import limit, wait_for

FORKED_BY = "preload_server.py"  # in a forked command's /proc/PID/cmdline: the preloader's


@pytest.fixture(scope="module")
def module_preloader(request, tmp_path_factory):
    """The worker's own preloader where the suite started one (tests/conftest.py: with one OpenMP
    thread, as here), else one of the module's: each imports for ~7 CPU-s."""
    shared = request.config.stash.get(PRELOADER, None)
    if shared is not None:
        yield shared
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        env.delenv(SOCKET_ENV, raising=False)
        preloader = Preloader(tmp_path_factory.mktemp("preload") / "preload.log")
        try:
            preloader.wait(limit(300))
            yield preloader
        finally:
            preloader.stop()


@pytest.fixture
def preloader(module_preloader, monkeypatch):
    """The module's preloader, named in this process's environment for the test."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key, value in module_preloader.env.items():
        monkeypatch.setenv(key, value)
    return module_preloader


def _forked(pid: int) -> bool:
    return FORKED_BY in Path(f"/proc/{pid}/cmdline").read_text()


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit(120))


def test_a_forked_command_prints_and_exits_as_the_same_command_started_afresh(preloader, tmp_path):
    """Output apart on stdout and stderr, exit status, working folder (a relative run folder),
    arguments: the same; and the preloader did fork it."""
    with Store.open(tmp_path / "run" / "clawrl.db"):
        pass  # an empty run, found only from the right folder
    fresh_env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
    for argv in (["versions", "--run-dir", "run"], ["versions", "--run-dir", "nowhere"], ["--help"]):
        fresh, forked = _run(["clawrl", *argv], tmp_path, fresh_env), _run(["clawrl", *argv], tmp_path)
        seen = [(p.returncode, p.stdout, p.stderr) for p in (fresh, forked)]
        assert seen[1] == seen[0], argv
        assert f"clawrl {' '.join(argv)}\n" in preloader.log.read_text(), argv
    assert fresh.returncode == 0 and "usage: clawrl" in fresh.stdout


def test_a_server_the_launcher_starts_is_forked_and_a_server_of_its_own(preloader, tmp_path, tiny_model_dir):
    """The package's launcher starts it plainly; it is forked all the same. Its environment (the
    API key), its own random seeds; a signal to its stand-in reaches it, and the stand-in SIGKILLed
    takes it along."""
    args = ["--model", str(tiny_model_dir)]
    servers: list[ServerProcess] = []
    try:
        for i in range(2):
            servers.append(
                ServerProcess(tmp_path / f"run{i}", args, env={"CLAWRL_API_KEY": "k"}, off=("train", "guard"))
            )
        pids = [int((s.run_dir / "server.lock").read_text()) for s in servers]
        assert all(_forked(pid) for pid in pids) and pids[0] != servers[0].proc.pid
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
        first.kill()  # the stand-in
        assert first.wait(limit(60)) == -signal.SIGKILL
        wait_for(lambda: not Path(f"/proc/{pids[0]}").exists(), 60, "the server gone with its stand-in")
        servers[1].stop()  # SIGTERM, passed on
        assert second.returncode == -signal.SIGTERM
        assert not Path(f"/proc/{pids[1]}").exists()
    finally:
        for server in servers:
            server.stop()


def test_what_a_fork_cannot_honour_runs_apart(preloader, monkeypatch, tmp_path, tiny_model_dir):
    """An import-time variable that differs (OpenMP's threads), a program not clawrl, a preloader
    gone: the process runs as started, and the preloader says why it refused."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with ServerProcess(tmp_path / "run", ["--model", str(tiny_model_dir)], off=("train", "guard")) as server:
        assert int((server.run_dir / "server.lock").read_text()) == server.proc.pid
    assert "environment differs from the preloader's in OMP_NUM_THREADS" in preloader.log.read_text()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    other = _run(["json.tool", "--help"], tmp_path)
    assert other.returncode == 0 and "json.tool" in other.stdout
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "no-such-socket"))
    assert _run(["clawrl", "--help"], tmp_path).returncode == 0


def test_a_forked_trainer_leaves_with_its_server(preloader, tmp_path, tiny_model_dir):
    """The server's trainer is forked too, so it is not the server's child: it watches the server's
    pid (clawrl/exit_watch.py), and a SIGKILLed server leaves no trainer behind."""
    args = ["--model", str(tiny_model_dir), "--train.nice", "0"]
    with ServerProcess(tmp_path / "run", args, off=("guard",)) as server:
        lock = server.run_dir / "trainer.lock"
        trainer = int(wait_for(lambda: lock.is_file() and lock.read_text().strip(), 120, "the trainer"))
        assert _forked(trainer)
        os.kill(int((server.run_dir / "server.lock").read_text()), signal.SIGKILL)
        assert server.proc.wait(limit(60)) == -signal.SIGKILL  # its stand-in says so
        wait_for(lambda: not Path(f"/proc/{trainer}").exists(), 60, "the trainer gone with its server")


def test_a_stand_in_passes_signals_on_and_ends_as_its_command(preloader, tmp_path, tiny_model_dir):
    """(How torch's elastic agent sees a trainer group's ranks.) A signal to the stand-in is passed
    on and ends it as it ended the command; the stand-in SIGKILLed (the agent's last resort) takes
    the command with it; the command killed, the stand-in ends so."""
    for to, sig in (("stand-in", signal.SIGTERM), ("stand-in", signal.SIGKILL), ("command", signal.SIGKILL)):
        run_dir = tmp_path / f"run-{to}-{sig.name}"
        run_dir.mkdir()
        pid, stand_in = _waiting_trainer(run_dir, tiny_model_dir)
        try:
            assert pid != stand_in.pid and _forked(pid)
            os.kill(stand_in.pid if to == "stand-in" else pid, sig)
            assert stand_in.wait(limit(60)) == -sig, (to, sig)
            gone = lambda p=pid: not Path(f"/proc/{p}").exists()  # noqa: E731
            wait_for(gone, 60, f"the trainer gone ({to}, {sig.name})")
        finally:
            stand_in.kill()
            stand_in.wait()


def _waiting_trainer(run_dir: Path, model: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """`clawrl train` (`python -u`, as a rank is started) on a run with no samples: it waits,
    holding the run's lock, which names its pid. (The pid, the stand-in.)"""
    lock = run_dir / "trainer.lock"
    trainer = [sys.executable, "-u", *CLAWRL[1:], "train", "--run-dir", str(run_dir), "--model", str(model)]
    stand_in = subprocess.Popen(trainer, cwd=run_dir)
    pid = wait_for(lambda: lock.is_file() and lock.read_text().strip(), 120, "the trainer holding its run")
    return int(pid), stand_in
