"""clawrl/exit_watch.py: a trainer's check that its server has exited."""

from __future__ import annotations

import subprocess
import sys

from clawrl.exit_watch import exit_watch
from tests.timing import wait_for


def test_the_exit_watch_says_when_a_process_has_exited_even_before_it_is_reaped():
    """It watches the pid it is given, not this process's parent, and sees a zombie as gone."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone = exit_watch(proc.pid)
    try:
        assert not gone()
        proc.kill()  # not waited for yet: a zombie, as a SIGKILLed server before its parent reaps it
        wait_for(gone, 30, "the watch to see the exit")
    finally:
        proc.wait()
    assert exit_watch(proc.pid)()  # reaped: no such process
