"""The suite's preloader: `clawrl` processes forked from one pre-imported process per pytest worker.

Every `clawrl serve`, trainer, trainer rank and `clawrl` command the tests start is a `python -m
clawrl ...`, ~7 s of which is importing torch, transformers and FastAPI (docs/benchmarks.md, "Where
the suite's time goes"). `Preloader` starts preload_server.py, which imports them once; its `env`
puts this folder first on PYTHONPATH and names the preloader's socket. A Python started with that
environment reads sitecustomize.py here first, and a `python -m clawrl ...` has the preloader fork
the command and stands in for it (preload_client.py). The package starts its processes plainly:
this hooks them from outside, as coverage.py measures subprocesses.

A stand-in is what its starter holds (`Popen.pid`); the command's own pid is the one it writes in
its run folder's lock (`server.lock`, `trainer.lock`).

It needs one OpenMP thread (torch's import starts a thread pool otherwise, and a process with
threads is not forked; scripts/test sets it) and Linux (it counts its native threads in /proc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
SOCKET_ENV = "CLAWRL_TEST_PRELOAD_SOCKET"  # preload_client.SOCKET_ENV


def hooked_pythonpath(env: dict[str, str] | os._Environ[str]) -> str:
    """`env`'s PYTHONPATH with this folder first (sitecustomize.py is read from the first found)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HERE)]
    return os.pathsep.join([str(HERE), *rest])


class Preloader:
    """preload_server.py started from this process's environment (with this folder on PYTHONPATH),
    its output in `log`. It imports in the background: `wait` until it listens, then give children
    `env`. `stop` ends it; the commands it forked run on (their stand-ins hold them)."""

    def __init__(self, log: Path) -> None:
        self.folder = tempfile.mkdtemp(prefix="clawrl-preload-")  # short: a socket's path has ~100 bytes
        self.socket = os.path.join(self.folder, "socket")
        self.log = log
        self.env = {"PYTHONPATH": hooked_pythonpath(os.environ), SOCKET_ENV: self.socket}
        env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
        env["PYTHONPATH"] = self.env["PYTHONPATH"]
        with open(log, "w") as out:
            command = [sys.executable, str(HERE / "preload_server.py"), self.socket]
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)

    def wait(self, timeout_s: float) -> None:
        """Until it listens (its imports done); RuntimeError with its log if it exits or takes longer."""
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the preloader did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def own_pids(self) -> set[int]:
        """Its pid and its waiters' (one per live command): not strays while it runs. The commands
        themselves are the waiters' children, and are."""
        try:
            return {self.proc.pid, *(p.pid for p in psutil.Process(self.proc.pid).children())}
        except psutil.NoSuchProcess:
            return set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
