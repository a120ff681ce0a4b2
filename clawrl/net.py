"""Small network helpers shared by every layer (a shared contract: no clawrl imports)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
