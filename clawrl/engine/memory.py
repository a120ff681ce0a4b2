"""Give freed heap memory back to the operating system when the engine goes idle.

A burst of requests grows the batch's tensors; once they are freed, glibc keeps much of that
memory in its arenas, so the server's RSS stays near the peak of the busiest moment. Trimming
when the batch empties returns it (bench/load.py: within a few percent of the start instead of
~10% above). A no-op where the C library has no `malloc_trim` (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _trim():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def release_free_memory() -> None:
    trim = _trim()
    if trim is not None:
        trim(0)
