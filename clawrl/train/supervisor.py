"""The server's side of the trainer process: start it, relay its log, restart it when it dies.

`clawrl serve` runs `clawrl train --config <run_dir>/config.json --exit-with-parent <pid>`
as a child process, created and awaited in the app's lifespan. Its output
lines are relayed to the server's log (so training progress shows in the
terminal and in `logs/server.log`). When it exits while the server runs, it
is restarted after `restart_backoff_s`, doubling after each quick failure up to
`restart_backoff_max_s` (a trainer that ran 5 minutes starts the count over).
`paused()` stops it and starts a fresh one around a user's data erased while serving (docs/users.md).
Serving never waits on any of this; `health()` says how it goes (a
`TrainerHealth`), which `/healthz` shows as `trainer`:

    {"status": "starting" | "running" | "restarting" | "stopped",
     "pid", "restarts", "last_exit", "last_error", "restart_in_s"}

With `train.distributed.num_processes` N > 1 the child is the group's launcher
(`train/launch.py`): `pid` is the launcher's, a failed rank ends the whole
group and the group is restarted as one. `/healthz` then adds
`"num_processes": N` and `"ranks"`: one entry per rank (`train/ranks.py`),

    {"rank", "pid", "state": "starting" | "loading" | "waiting" | "training" | "publishing"
                             | "stopped" | "exited", "version", "step", "for_s"}
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.config import TrainConfig
from clawrl.store.locks import TRAINER_LOCK
from clawrl.train.ranks import read_ranks

log = logging.getLogger("clawrl.trainer")
_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}
HEALTHY_RUN_S = 300.0  # a run this long resets the backoff
# A field the JSON leaves out while it is None (see `to_json` in api/state.py).
OMIT_IF_NONE = {"omit_if_none": True}


@dataclass(frozen=True)
class TrainerHealth:
    """The trainer process as the server sees it (`trainer` on /healthz and the dashboard)."""

    status: str  # "starting" | "running" | "restarting" | "stopped"
    pid: int | None  # the running process's (the launcher's, for a group)
    restarts: int
    last_exit: int | None
    last_error: str | None
    restart_in_s: float | None  # while "restarting"
    # With several ranks only (absent from the JSON with one): N, and one entry per rank (train/ranks.py).
    num_processes: int | None = field(default=None, metadata=OMIT_IF_NONE)
    ranks: list[dict[str, Any]] | None = field(default=None, metadata=OMIT_IF_NONE)


class TrainerSupervisor:
    def __init__(self, config_file: Path, run_dir: Path, cfg: TrainConfig) -> None:
        self.command = [
            sys.executable,
            "-m",
            "clawrl",
            "train",
            "--config",
            str(config_file),
            "--run-dir",
            str(run_dir),
            "--exit-with-parent",
            str(os.getpid()),
        ]
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.status = "starting"
        self.restarts = 0
        self.last_exit: int | None = None
        self.last_error: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._restart_at: float | None = None
        self._stopping = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name="clawrl-trainer-supervisor")

    async def stop(self) -> None:
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.status = "stopped"

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """The trainer stopped for the block, then started afresh: a user's data is erased under it
        (a step in flight on their samples must not publish, and nothing of theirs stays in its memory)."""
        await self.stop()
        try:
            yield
        finally:
            self._stopping = False
            self.status = "starting"
            await self.start()

    def health(self) -> TrainerHealth:
        wait = None if self._restart_at is None else max(0.0, self._restart_at - time.monotonic())
        pid = self._proc.pid if self._proc is not None and self.status == "running" else None
        world = self.cfg.distributed.num_processes
        ranks = None
        if world > 1:  # a group: its size and each rank's state
            ranks = [] if pid is None else read_ranks(self.run_dir, self._launcher() or pid, world)
        return TrainerHealth(
            status=self.status,
            pid=pid,
            restarts=self.restarts,
            last_exit=self.last_exit,
            last_error=self.last_error,
            restart_in_s=None if wait is None else round(wait, 1),
            num_processes=None if ranks is None else world,
            ranks=ranks,
        )

    def _launcher(self) -> int | None:
        """The group's launcher as its ranks name it: the pid it wrote in the trainer lock it holds
        for them, while that process lives. It is the process started here unless something stands
        between the two (a wrapper that starts the command)."""
        try:
            pid = int((self.run_dir / TRAINER_LOCK).read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            await self._run_once()
            if self._stopping:
                return
            failures = 1 if time.monotonic() - started > HEALTHY_RUN_S else failures + 1
            delay = min(self.cfg.restart_backoff_s * 2 ** (failures - 1), self.cfg.restart_backoff_max_s)
            why = self.last_error or "no output"
            log.error("the trainer exited with %s (%s); restarting in %.1f s", self.last_exit, why, delay)
            self.status, self._restart_at = "restarting", time.monotonic() + delay
            await asyncio.sleep(delay)
            self.restarts += 1
            self._restart_at = None

    async def _run_once(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self.status = "running"
        tail: deque[str] = deque(maxlen=20)
        assert self._proc.stdout is not None
        async for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                tail.append(line)
                level, _, rest = line.partition(" ")  # the trainer logs "LEVEL message" when supervised
                if level not in _LEVELS:  # a traceback, a library's print
                    level, rest = "INFO", line
                log.log(_LEVELS[level], "%s", rest)
        self.last_exit = code = await self._proc.wait()
        if code < 0:
            self.last_error = f"killed by {signal.Signals(-code).name}"
        elif code != 0 and tail:
            self.last_error = tail[-1]  # a traceback ends with the exception itself
