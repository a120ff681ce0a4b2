"""Give freed heap memory back to the operating system when the engine goes idle.

A burst of requests grows the batch's tensors; once they are freed, glibc keeps much of that
memory in its arenas, so the server's RSS stays near the peak of the busiest moment. Trimming
when the batch empties returns it (bench/load.py: within a few percent of the start instead of
~10% above). A no-op where the C library has no `malloc_trim` (macOS, musl).

`mapped_large_allocations`: while a CPU trainer step runs on a long sample (an agent's 10k-token
turn), glibc's heap keeps the freed activation buffers of each recomputed layer and the RSS
climbs far above what is live: one step of the embedded model on a 3,000-token sample peaked
3.9 GB above the loaded model with glibc's defaults, 0.9 GB with every allocation over 1 MB
mapped (and so returned to the system when freed), for 1.3x the step time. Inside the block
the threshold is fixed at 1 MB; after it, at 32 MB (glibc's own ceiling for its moving
threshold), so short steps and serving keep their speed. A no-op without `mallopt`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


@cache
def _trim():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


@cache
def _mallopt():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "mallopt", None)


@contextmanager
def mapped_large_allocations(on: bool = True, threshold: int = 1 << 20) -> Iterator[None]:
    """Inside: allocations over `threshold` bytes are mapped, and unmapped when freed (module docstring)."""
    mallopt = _mallopt() if on else None
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, 32 << 20)


def release_free_memory() -> None:
    trim = _trim()
    if trim is not None:
        trim(0)
