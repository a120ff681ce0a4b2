"""Time limits for tests: generous upper bounds, scaled by one knob.

A test waits for an event (a health check, a version row, a token); the limit
only says when to give up. Every limit in the suite goes through `limit()`, so
a slow or loaded machine can stretch them all at once:

    CLAWRL_TEST_TIME_SCALE=3 ./scripts/test

The default scale is 1. A limit is never the expected duration: on a quiet
machine the events arrive long before it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

SCALE_ENV = "CLAWRL_TEST_TIME_SCALE"

T = TypeVar("T")


def scale() -> float:
    """The factor every test time limit is multiplied by (`CLAWRL_TEST_TIME_SCALE`, default 1)."""
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{SCALE_ENV} must be a number, got {raw!r}") from exc
    if value <= 0:
        raise ValueError(f"{SCALE_ENV} must be positive, got {raw!r}")
    return value


def limit(seconds: float) -> float:
    """An upper bound of `seconds` on a normal machine, stretched by the scale."""
    return seconds * scale()


def wait_for(check: Callable[[], T | None], seconds: float, what: str, every: float = 0.1) -> T:
    """Poll `check()` until it returns something truthy; fail naming `what` after `limit(seconds)`."""
    deadline = time.monotonic() + limit(seconds)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {limit(seconds):.0f} s")
        time.sleep(every)
