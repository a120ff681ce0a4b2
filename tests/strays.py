"""A pytest plugin: the run leaves no process behind. At the end of the session the processes the
pytest process started (its descendants) that are still running fail the run, named, and are killed.

A test that starts a real process (a server, a trainer, a `clawrl` command) and fails must still
stop it; one that does not leaves load on a shared machine and a port or a run folder's lock taken
for the next run. A process on its way out (stopped in a fixture's teardown) has `GRACE_S` to go.
Under pytest-xdist each worker checks its own descendants and reports them to the controller, which
fails the run (its own children are the workers). Processes the session keeps on purpose until
the end (the preloader: tests/preload) are named by `config.stash[KEPT]`.

tests/conftest.py registers it; `pytest -p tests.strays` elsewhere.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import psutil  # accelerate's dependency, so clawrl's
import pytest

from tests.timing import limit

KEPT = pytest.StashKey[Callable[[], set[int]]]()  # the pids the session keeps on purpose, when asked
FOUND = pytest.StashKey[list[str]]()  # the strays, described
WORKER_KEY = "clawrl_strays"  # in a worker's output to the xdist controller
GRACE_S = 10.0


def left_behind(kept: Callable[[], set[int]], grace_s: float) -> list[psutil.Process]:
    """This process's running descendants but `kept()`, once they stay `grace_s` (none sooner)."""
    deadline = time.monotonic() + grace_s
    while True:
        own = kept()
        alive = [p for p in _descendants() if p.pid not in own and _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (exited, waiting for a parent to read its status: gone already)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid}: {' '.join(p.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {p.pid} (gone meanwhile)"


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.pluginmanager.hasplugin("dsession"):  # the xdist controller: its workers report
        found = config.stash.get(FOUND, [])
    else:
        strays = left_behind(config.stash.get(KEPT, set), limit(GRACE_S))
        found = [describe(p) for p in strays]
        for p in strays:  # after naming them: nothing of a failed run keeps running
            with contextlib.suppress(psutil.Error):
                p.kill()
        if hasattr(config, "workeroutput"):  # an xdist worker: to the controller
            config.workeroutput[WORKER_KEY] = found
    if found:
        config.stash[FOUND] = found
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """(xdist, in the controller) A worker finished: keep the strays it found."""
    found = getattr(node, "workeroutput", {}).get(WORKER_KEY, [])
    if found:
        config: pytest.Config = node.config  # type: ignore[attr-defined]
        config.stash[FOUND] = config.stash.get(FOUND, []) + [f"{node.gateway.id} {x}" for x in found]  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(FOUND, [])
    if found:
        terminalreporter.write_sep("=", f"processes left behind (killed): {len(found)}", red=True)
        for line in found:
            terminalreporter.write_line(line)
