"""API keys and whose they are: a bearer header for /v1 and /metrics; that or a cookie for /dashboard.

`Keys` knows the admin key (`server.api_key`) and, with `server.users` (docs/users.md), each user's
key. A request's key names its `Caller`: the admin key and a server without users are the user
`default`, who sees every user's records (`admin`); a user's key is that user, who sees their own.
An unknown key is a 401. The guards put the caller on `request.state.caller` (`caller_of`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request

from clawrl.api.errors import Unauthorized
from clawrl.types import DEFAULT_USER


@dataclass(frozen=True)
class Caller:
    """Who sent a request: their user, whether they see every user's records, and whether the server
    has several users (then the sessions a client names are the user's own: `session_id`)."""

    user: str = DEFAULT_USER
    admin: bool = True
    several: bool = False

    @property
    def owner(self) -> str | None:
        """Whose records the caller reads: their own, or every user's (None) for the admin."""
        return None if self.admin else self.user

    def session_id(self, named: str) -> str:
        """The stored id of a session the client names: with several users, within the user's own
        names (`user/name`), so two users' "main" are two sessions."""
        return f"{self.user}/{named}" if self.several else named

    def shown(self, session_id: str) -> str:
        """A stored session id as this caller named it (the inverse of `session_id`)."""
        return session_id.removeprefix(f"{self.user}/") if self.several else session_id


ANYONE = Caller()  # a server without keys: one user, who sees everything


class Keys:
    """The keys a server accepts and whose they are (see the module)."""

    def __init__(self, admin: str | None, users: dict[str, str] | None = None) -> None:
        self.admin = admin
        self.several = users is not None  # users on (even with every user removed from the file)
        self._callers = {admin.encode(): Caller(several=self.several)} if admin else {}
        for key, name in (users or {}).items():
            self._callers[key.encode()] = Caller(name, admin=False, several=True)

    @property
    def required(self) -> bool:
        return bool(self._callers)

    def who(self, given: str) -> Caller | None:
        """The caller whose key `given` is, or None. Each key is compared in constant time, so the
        time taken does not reveal how much of a key matched."""
        found = None
        for key, caller in self._callers.items():
            if hmac.compare_digest(given.encode(), key):
                found = caller
        return found

    def by_cookie(self, token: str) -> Caller | None:
        """The caller whose dashboard cookie (`dashboard_token` of their key) `token` is, or None."""
        found = None
        for key, caller in self._callers.items():
            if hmac.compare_digest(token.encode(), dashboard_token(key.decode()).encode()):
                found = caller
        return found

    def bearer(self, request: Request) -> Caller | None:
        """The caller of `Authorization: Bearer <key>`, or None (no header, or an unknown key)."""
        if not self.required:
            return ANYONE
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return self.who(given.strip()) if scheme.lower() == "bearer" else None


def caller_of(request: Request) -> Caller:
    """The caller a guard found (`ANYONE` on a route no guard ran on)."""
    return getattr(request.state, "caller", ANYONE)


def bearer_guard(keys: Keys, admin_only: bool = False):
    """A check of `Authorization: Bearer <key>` when keys are set: raises `Unauthorized`, else puts
    the caller on `request.state`. `admin_only`: a user's key is refused too (with users on).

    The /v1 routes run it before reading the body (`api.body.guarded_json_route`); it also works
    as a FastAPI dependency, `Depends(bearer_guard(keys))`."""

    async def check(request: Request) -> None:
        caller = keys.bearer(request)
        if caller is None:
            raise Unauthorized(
                "invalid or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )
        if admin_only and not caller.admin:
            raise Unauthorized(f"{request.url.path} needs the admin key", code="admin_key_required")
        request.state.caller = caller

    return check


COOKIE = "clawrl_dashboard"


def dashboard_token(api_key: str) -> str:
    """What the dashboard's cookie holds: an HMAC of the key, so a leaked cookie is not the API key."""
    return hmac.new(api_key.encode(), b"clawrl-dashboard-cookie", hashlib.sha256).hexdigest()


def browser_guard(keys: Keys):
    """`bearer_guard`, or the HttpOnly cookie `POST /dashboard/login` sets: for the dashboard's routes."""
    bearer = bearer_guard(keys)

    async def check(request: Request) -> None:
        cookie = request.cookies.get(COOKIE)
        caller = keys.by_cookie(cookie) if cookie and keys.required else None
        if caller is not None:
            request.state.caller = caller
            return
        await bearer(request)

    return check
