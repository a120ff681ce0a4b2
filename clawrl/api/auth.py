"""Bearer-key authentication for the /v1 routes."""

from __future__ import annotations

import hmac

from fastapi import Request

from clawrl.api.errors import Unauthorized


def bearer_guard(api_key: str | None):
    """A FastAPI dependency that checks `Authorization: Bearer <key>` when a key is set."""
    expected = api_key.encode() if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # Constant-time comparison: the time taken does not reveal how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Unauthorized(
                "invalid or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )

    return check
