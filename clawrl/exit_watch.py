"""A check of whether a process has exited: how a trainer notices that its server is gone.

`clawrl train --exit-with-parent PID` (the server's trainer, and each rank of a trainer group with
its launcher's pid) stops when PID exits. Through a pidfd on Linux, which says so for PID whoever
started this process, and even before PID is reaped; elsewhere, by this process's parent changing
(an orphan is adopted), which holds where PID is the parent.

Pure standard library: this module sits at the bottom of the layers.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable


def exit_watch(pid: int) -> Callable[[], bool]:
    """A check, cheap enough to call every step, of whether process `pid` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: True
    except (AttributeError, OSError):
        return lambda: os.getppid() != pid
    return lambda: bool(select.select([fd], [], [], 0)[0])
