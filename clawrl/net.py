"""Small network helpers shared by every layer (a shared contract: no clawrl imports)."""

from __future__ import annotations

import socket

import httpx


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A pooled HTTP connection is dropped after this many idle seconds, under the 5 s at which
# uvicorn-based servers (vLLM, and any ASGI server on its defaults) close theirs: reusing one the
# server is closing at that moment fails the request with a ReadError (seen on `clawrl envs train`).
CLIENT_KEEPALIVE_S = 2.0


def pool_limits(max_connections: int | None = 100) -> httpx.Limits:
    """httpx's connection limits with `CLIENT_KEEPALIVE_S` as the idle expiry."""
    return httpx.Limits(max_connections=max_connections, keepalive_expiry=CLIENT_KEEPALIVE_S)
