"""The client tier: real agents (OpenClaw from npm) against a live `clawrl serve`.

`scripts/setup-openclaw` installs node and a pinned openclaw into clawrl's cache folder
the first time (about a minute); later runs find it there. The tier is skipped, with the
reason, only when the npm registry cannot be reached to install it.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from clawrl.eval.openclaw import install
from tests.timing import limit

REGISTRY = "https://registry.npmjs.org/openclaw"


def _registry_reachable() -> bool:
    try:
        with urllib.request.urlopen(REGISTRY, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def openclaw_bin() -> Path:
    """The `openclaw` launcher (node included), installed once."""
    try:
        return install(timeout=limit(900)) / "openclaw"
    except RuntimeError:
        if not _registry_reachable():
            pytest.skip(f"the npm registry ({REGISTRY}) is unreachable: OpenClaw cannot be installed")
        raise
