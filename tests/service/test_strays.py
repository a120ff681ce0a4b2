"""tests/strays.py: a run that leaves a process behind fails, naming it, and the process is killed;
under pytest-xdist too, where a worker finds it and the controller fails the run. Each case is
a pytest run of its own on a test file written here (the plugin alone, no clawrl process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.timing import limit, wait_for

TESTS = """
import subprocess
from pathlib import Path


def test_starts_a_process_and_stops_it():
    proc = subprocess.Popen(["sleep", "300"])
    proc.kill()
    proc.wait()


def test_starts_a_process_and_leaves_it(tmp_path):
    if {leave}:
        proc = subprocess.Popen(["sleep", "301"])
        Path({pid_file!r}).write_text(str(proc.pid))
"""


def _run(tmp_path: Path, leave: bool, *options: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    pid_file = tmp_path / "pid"
    test_file = tmp_path / "test_leaving.py"
    test_file.write_text(TESTS.format(leave=leave, pid_file=str(pid_file)))
    # The plugin under test and xdist alone: the installed plugins pytest would load by itself
    # (schemathesis, hypothesis, ...) cost each interpreter ~2 CPU-s and play no part here.
    plugins = ["-p", "tests.strays", "-p", "xdist.plugin", "-p", "no:cacheprovider"]
    command = [sys.executable, "-m", "pytest", *plugins, *options, str(test_file)]
    env = os.environ | {"CLAWRL_TEST_TIME_SCALE": "0.2", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # grace: 2 s
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(120))
    return proc, pid_file


@pytest.mark.parametrize("options", [(), ("-n", "1")], ids=["one-process", "xdist"])
def test_a_process_left_behind_fails_the_run_named_and_is_killed(tmp_path, options):
    run, pid_file = _run(tmp_path, True, *options)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    pid = int(pid_file.read_text())
    assert "processes left behind (killed): 1" in run.stdout
    assert f"pid {pid}: sleep 301" in run.stdout
    gone = lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # noqa: E731
    wait_for(gone, 30, "the stray killed")


def test_a_run_that_stops_its_processes_passes(tmp_path):
    """(Under xdist: neither the worker nor the controller, whose children the workers are, flags one.)"""
    run, _ = _run(tmp_path, False, "-n", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "left behind" not in run.stdout
