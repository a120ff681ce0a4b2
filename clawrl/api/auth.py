"""API-key authentication: a bearer header for /v1 and /metrics; that or a cookie for /dashboard."""

from __future__ import annotations

import hashlib
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


COOKIE = "clawrl_dashboard"


def dashboard_token(api_key: str) -> str:
    """What the dashboard's cookie holds: an HMAC of the key, so a leaked cookie is not the API key."""
    return hmac.new(api_key.encode(), b"clawrl-dashboard-cookie", hashlib.sha256).hexdigest()


def browser_guard(api_key: str | None):
    """`bearer_guard`, or the HttpOnly cookie `POST /dashboard/login` sets: for the dashboard's routes."""
    bearer = bearer_guard(api_key)
    token = dashboard_token(api_key).encode() if api_key else None

    async def check(request: Request) -> None:
        if token is not None and hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), token):
            return
        await bearer(request)

    return check
