"""bench/gpu_check.py, the check for a lent GPU machine, at its tiny shape on the CPU.

The script is what a person runs once on a GPU with no network; this keeps every step of it
running here (the plan, the engine, a trainer process beside it, the swap under load, the table
and its files), so the one GPU run is not its first run. Nothing here is timed but the bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.gpu_check import parse_smi
from tests.conftest import ROOT
from tests.timing import limit

STEPS = [
    "device", "model, tiny shape", "placement plan", "decode, 1 stream(s)", "decode, 4 stream(s)",
    "trainer step beside the engine", "swap under load", "memory, server", "memory, trainer",
    "the whole check",
]  # fmt: skip


def test_the_gpu_check_runs_every_step_at_the_tiny_shape_on_the_cpu(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry", "--out", str(tmp_path)]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}  # the CPU path, even on a machine with a GPU
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit(300), env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    result = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {r["step"]: r for r in result["rows"]}
    assert list(rows) == STEPS
    assert result["failed"] is False
    assert "on the CPU" in result["run"]
    # The plan is the one --dry-run prints: the server and the trainer on the described GPU.
    assert "GPU 0 (80.0 GiB)" in result["plan"] and "trainer" in result["plan"]
    for step in ("model, tiny shape", "placement plan", "swap under load", "decode, 4 stream(s)"):
        assert rows[step]["verdict"] == "ok", rows[step]
    swap = rows["swap under load"]["result"]
    assert "0 failed or short" in swap and swap.endswith("the next request v1")
    # A CPU reads no GPU memory: the rows say so instead of passing.
    assert rows["memory, server"]["verdict"] == "-" and "not checked" in rows["memory, server"]["result"]
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| swap under load |" in markdown and "GPU 0 (80.0 GiB)" in markdown
    assert "swap under load" in done.stdout  # the table is printed too


def test_nvidia_smi_lines_are_summed_by_process_and_unreadable_ones_left_out():
    text = "4242, 30512\n4243, 17000\n4242, 1024\n4300, [N/A]\n"
    assert parse_smi(text) == {4242: 31536, 4243: 17000}
    assert parse_smi("") == {}
