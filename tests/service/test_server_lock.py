"""One server per run folder (docs/several-processes.md): `clawrl serve` holds `server.lock` for its
life; a second one on the same folder exits 2 naming the holder's pid, before it rewrites config.json
or starts anything; once the first has exited (however: the kernel drops an flock with its process),
a server starts there again. Through the suite's preloader (tests/preload), as every test server runs."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.conftest import CLAWRL, ROOT, RemoteServer
from tests.timing import limit, wait_for


def test_a_second_server_on_a_served_run_folder_exits_2_naming_the_holder(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    first = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    try:
        pid = int((run_dir / "server.lock").read_text())
        os.kill(pid, 0)  # the lock names a live process: the server itself
        config = (run_dir / "config.json").read_bytes()
        second = subprocess.run(
            [*CLAWRL, "serve", "--run-dir", str(run_dir), "--model", str(tiny_model_dir),
             "--server.port", "1", "--train.enabled", "false"],
            cwd=ROOT, capture_output=True, text=True, timeout=limit(120),
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"another clawrl serve (pid {pid}) holds {run_dir}" in second.stderr
        assert (run_dir / "config.json").read_bytes() == config  # untouched
        assert first.health()["status"] == "ok"
    finally:
        first.stop()


def test_a_killed_servers_lock_is_released_and_a_new_server_takes_the_folder(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    first = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    pid = int((run_dir / "server.lock").read_text())
    try:
        os.kill(pid, signal.SIGKILL)  # no clean-up runs: only the kernel drops the lock
        wait_for(lambda: first.proc.poll() is not None, 60, "the killed server's stand-in exiting")
    finally:
        first.stop()
    again = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    try:
        assert int((run_dir / "server.lock").read_text()) not in (pid, 0)
        assert again.health()["status"] == "ok"
    finally:
        again.stop()
