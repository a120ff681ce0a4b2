"""Every rank's state, for `/healthz`: one small JSON file per rank of a trainer group.

    <run_dir>/trainer-group/config.json     the resolved config the launcher gave its ranks
    <run_dir>/trainer-group/rank<N>.json    {"rank", "pid", "group", "state", "version", "step", "since"}

A rank rewrites its file (atomically) when its state changes: `loading`,
`waiting` (for samples), `training`, `checking` (rank 0: the canary gate), `publishing` (rank 0),
`stopped`.
`group` is the pid of the launcher that started the rank (the pid it exits with), so a
file left by an earlier group is told apart; the launcher empties the folder
when it starts. `read_ranks` is what the server shows: one entry per rank of
the current group, `starting` until a rank writes its first state, and
`exited` for a rank whose process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

GROUP_DIR = "trainer-group"


def group_dir(run_dir: Path) -> Path:
    return Path(run_dir) / GROUP_DIR


def reset_group_dir(run_dir: Path) -> Path:
    """An empty `trainer-group/` folder (the launcher's, at start)."""
    folder = group_dir(run_dir)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


class RankStatus:
    """This rank's state file."""

    def __init__(self, run_dir: Path, rank: int, group: int) -> None:
        self.path = group_dir(run_dir) / f"rank{rank}.json"
        self.rank, self.group = rank, group
        self._last: tuple[str, str, int] | None = None

    def set(self, state: str, version: str, step: int) -> None:
        if self._last == (state, version, step):
            return
        self._last = (state, version, step)
        entry = {
            "rank": self.rank,
            "pid": os.getpid(),
            "group": self.group,
            "state": state,
            "version": version or None,
            "step": step,
            "since": time.time(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry))
        tmp.replace(self.path)  # a reader sees the old state or the new one, never half a file


def read_ranks(run_dir: Path, group: int, world: int) -> list[dict[str, Any]]:
    """One entry per rank 0..world-1 of the group launched by pid `group`, as `/healthz` shows them."""
    now = time.time()
    out = []
    for rank in range(world):
        entry: dict[str, Any] = {"rank": rank, "pid": None, "state": "starting"}
        try:
            data = json.loads((group_dir(run_dir) / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            data = None
        if data is not None and data.get("group") == group:
            entry = {k: data.get(k) for k in ("rank", "pid", "state", "version", "step")}
            entry["for_s"] = round(now - float(data.get("since", now)), 1)
            if not _alive(int(data["pid"])):
                entry["state"] = "exited"
        out.append(entry)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
