"""Bearer-key authentication for the /v1 routes."""

from __future__ import annotations

import hmac

from fastapi import Request

from clawrl.api.errors import Unauthorized


def bearer_guard(api_key: str | None):
    """A check of `Authorization: Bearer <key>` when a key is set: raises `Unauthorized`.

    The /v1 routes run it before reading the body (`api.body.guarded_json_route`); it also works
    as a FastAPI dependency, `Depends(bearer_guard(key))`."""
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
