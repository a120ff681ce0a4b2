"""Where the test suite's CPU goes: the suite run with every process it starts sampled from /proc.

    python3 bench/suite_cpu.py [--interval S] [--json FILE] [-- SCRIPTS_TEST_ARGS...]

Runs `scripts/test` (the README's test command; arguments after `--` go to it, e.g. `-- --quick`
or `-- tests/service`) and, every `--interval` seconds (1), reads the CPU seconds (user + system)
of every process descended from this one: the pytest workers, the servers, trainers and ranks they
fork, vLLM's processes, OpenClaw's node, Chromium. This process makes itself their subreaper, so a
process that detaches (double-forks) still counts. Each process is put in a group by its command
line and by the test that started it (the pytest temporary folder in its working folder or among
its open files, which pytest names after the test or fixture):

    vLLM: test_thinking      the vLLM processes started for that test or fixture
    clawrl: openclaw         clawrl processes (servers, trainers, ranks) started there
    pytest workers           the tests' own code, run inside the xdist workers
    node (OpenClaw), Chromium, set-up (pip, the model's conversion), other

It prints each group's CPU seconds and its share of the run's total (the baseline measured in the
same run), the wall time, and the cores kept busy (CPU seconds / wall seconds) out of the machine's.
A suite that keeps every core busy is bound by its CPU work: its wall time on a machine is that
work over the cores it gets, and only less work makes it shorter.

A process that starts and ends between two samples is missed. Beside the sampled total, getrusage's
count of the processes waited for: a lower bound (a process its parent never waits for, such as one
the tests' preloader forks, is not in it). Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
# pytest's folder for a test or fixture: under the xdist worker's folder, or the run's without xdist
TEST_DIRS = (re.compile(r"/popen-gw\d+/([^/]+?)\d*(?:/|$)"), re.compile(r"/pytest-\d+/([^/]+?)\d*(?:/|$)"))
NO_FOLDER = ": no pytest folder (the preloaders among them)"


@dataclass
class Proc:
    """One process seen: its command line, the pytest folder it works in, its CPU seconds so far."""

    cmd: str
    where: str | None = None
    cpu: float = 0.0


def group_of(cmd: str, where: str | None) -> str:
    """The group a process's CPU counts in, from its command line and its pytest folder."""
    found = [m.group(1) for m in (p.search(where or "") for p in TEST_DIRS) if m]
    named = f": {found[0]}" if found else NO_FOLDER
    if "pip install" in cmd or "ensure_embedded" in cmd:
        return "set-up (pip, the model's conversion)"
    if "exec(eval(sys.stdin" in cmd or re.search(r"-m pytest\b", cmd):
        return "pytest workers"
    head = cmd.split(" ", 1)[0]
    if head.endswith("/node") or head == "node" or "openclaw" in cmd:
        return "node (OpenClaw)"
    if "chromium" in cmd or "chrome" in head:
        return "Chromium"
    if "vllm" in cmd and "vllm_standin" not in cmd:
        return "vLLM" + named
    if "clawrl" in cmd or "preload" in cmd or "multiprocessing" in cmd or "bench/" in cmd:
        return "clawrl" + named
    return "other"


def _stat(pid: str) -> tuple[int, int, float]:
    """(parent pid, start time in ticks, CPU seconds) of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[19]), (int(rest[11]) + int(rest[12])) / HZ


def _where(pid: str) -> str | None:
    """A pytest temporary folder the process works in or has open, if any."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        if "pytest-" in cwd:
            return cwd
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if "pytest-" in target:
                return target
    except OSError:
        return None
    return None


def sample(seen: dict[tuple[int, int], Proc], me: int) -> None:
    """One pass over /proc: every descendant of `me`, its CPU so far."""
    stats: dict[int, tuple[int, int, float]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stats[int(pid)] = _stat(pid)
            except (OSError, ValueError, IndexError):
                continue
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _, _) in stats.items():
        children[ppid].append(pid)
    stack = list(children[me])
    while stack:
        pid = stack.pop()
        stack.extend(children[pid])
        _, start, cpu = stats[pid]
        proc = seen.get((pid, start))
        if proc is None:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            proc = seen[(pid, start)] = Proc(cmd)
        if proc.where is None and group_of(proc.cmd, None).endswith(NO_FOLDER):  # a group that names its test
            proc.where = _where(str(pid))
        proc.cpu = cpu


def run(args: argparse.Namespace) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    seen: dict[tuple[int, int], Proc] = {}
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(args.interval):
            sample(seen, os.getpid())

    thread = threading.Thread(target=sampler, daemon=True)
    start = time.time()
    suite = subprocess.Popen([str(ROOT / "scripts" / "test"), *args.test_args], cwd=ROOT)
    thread.start()
    code = suite.wait()
    wall = time.time() - start
    done.set()
    thread.join()
    while True:  # processes that detached and ended here, as this one's orphans: reap them
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for proc in seen.values():
        g = groups[group_of(proc.cmd, proc.where)]
        g[0] += proc.cpu
        g[1] += 1
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "exit": code,
        "wall_s": wall,
        "cores": os.cpu_count(),
        "sampled_cpu_s": sum(g[0] for g in groups.values()),
        "waited_cpu_s": usage.ru_utime + usage.ru_stime,
        "groups": {k: {"cpu_s": v[0], "processes": v[1]} for k, v in groups.items()},
    }


def report(result: dict, top: int) -> str:
    total = result["sampled_cpu_s"] or 1.0
    lines = [f"{'CPU s':>8}  {'share':>6}  {'procs':>5}  group"]
    ranked = sorted(result["groups"].items(), key=lambda kv: -kv[1]["cpu_s"])
    for name, g in ranked[:top]:
        lines.append(f"{g['cpu_s']:8.1f}  {g['cpu_s'] / total:6.1%}  {g['processes']:5d}  {name}")
    rest = ranked[top:]
    if rest:
        cpu = sum(g["cpu_s"] for _, g in rest)
        procs = sum(g["processes"] for _, g in rest)
        lines.append(f"{cpu:8.1f}  {cpu / total:6.1%}  {procs:5d}  ({len(rest)} more)")
    wall = result["wall_s"]
    lines.append(
        f"sampled CPU {result['sampled_cpu_s']:.0f} s (getrusage of the processes waited for, a lower bound: "
        f"{result['waited_cpu_s']:.0f} s) in {wall:.0f} s of wall time: "
        f"{result['sampled_cpu_s'] / wall:.2f} of {result['cores']} cores busy; exit {result['exit']}"
    )
    return "\n".join(lines)


def main() -> int:
    if sys.platform != "linux":
        print("bench/suite_cpu.py reads /proc: Linux only", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--top", type=int, default=30, help="groups printed, the rest summed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("test_args", nargs="*", help="after --: arguments for scripts/test")
    args = parser.parse_args()
    result = run(args)
    print(report(result, args.top))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result["exit"]


if __name__ == "__main__":
    sys.exit(main())
