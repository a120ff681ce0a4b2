"""One process of a kind per run folder: `clawrl serve` holds `server.lock`, the trainer `trainer.lock`.

A lock is an exclusive `flock` on a file in the run folder, held by an open file for the process's
life: the kernel releases it when the process dies, however it dies (SIGKILL included), so a lock
is never stale and nothing cleans up after a crash. The holder writes its pid into the file, so a
process refused can say whose it is. The file is opened close-on-exec (Python's default), so a
child the holder executes (the trainer, vLLM) does not inherit the lock.

`flock` works on a local file system. A run folder on a network file system (NFS) may not honour
it, and SQLite's locking, which the store relies on, is not safe there either: keep a run folder
on a local disk (docs/several-processes.md).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

SERVER_LOCK = "server.lock"
TRAINER_LOCK = "trainer.lock"


class FolderLocked(RuntimeError):
    """Another process holds this lock of the run folder; `pid` names it (None: it wrote none yet)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def hold(run_dir: Path, name: str, what: str) -> IO[str]:
    """Take `<run_dir>/<name>` for this process's life (keep the returned file open: closing it
    drops the lock); FolderLocked, naming the holder's pid, if another process has it. `what` names
    the kind of process in the message ("server", "trainer")."""
    handle = open(Path(run_dir) / name, "a+")  # noqa: SIM115 -- kept open: closing it would drop the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _pid_in(handle)
        handle.close()
        shown = "unknown" if pid is None else str(pid)
        raise FolderLocked(f"another {what} (pid {shown}) holds {run_dir}", pid) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def holder(run_dir: Path, name: str) -> int | None:
    """The pid of the process that holds `<run_dir>/<name>` now; None when nobody does (or it wrote
    no pid yet). A probe takes the lock shared for a moment, so a process starting in that moment
    is refused as if it were held: run it where none starts (a command beside a running server)."""
    path = Path(run_dir) / name
    if not path.is_file():
        return None
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_in(handle) or -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _pid_in(handle: IO[str]) -> int | None:
    handle.seek(0)
    text = handle.read().strip()
    return int(text) if text.isdigit() else None
