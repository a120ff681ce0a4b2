"""What each tier of the suite cost, printed at the end of a run (issue 58: where the time goes).

A tier is a folder under tests/ (unit, service, slow, client, browser, sandbox). Summed over every
phase (setup, call, teardown) of every test, on whichever worker ran it: worker seconds, not wall
time. Under xdist the reports reach the controller, which prints; a run of one worker prints too.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

_SECONDS: defaultdict[str, float] = defaultdict(float)
_TESTS: defaultdict[str, set[str]] = defaultdict(set)


def tier_of(nodeid: str) -> str:
    """'tests/unit/test_x.py::t' -> 'unit'; a test outside a tier folder is its own file's name."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[-1]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _SECONDS[tier] += report.duration
    _TESTS[tier].add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _SECONDS or hasattr(config, "workerinput"):  # a worker: the controller prints
        return
    terminalreporter.section("worker seconds per tier")
    total = sum(_SECONDS.values())
    for tier, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        share = seconds / total if total else 0.0
        terminalreporter.write_line(
            f"{tier:>10}  {seconds:8.1f} s  {share:6.1%}  {len(_TESTS[tier]):5d} tests"
        )
    terminalreporter.write_line(f"{'all':>10}  {total:8.1f} s")
