"""GET /dashboard: one page that shows, live, whether the model is learning and what is broken.

The page (`api/static/dashboard.html` with its script and style, shipped in the
package: no build step, no CDN, charts drawn as SVG by the script) polls
`/dashboard/state.json` (the `PipelineState` snapshot: cached for a second,
bounded reads; made JSON by `state_json`) every two seconds and redraws. `/dashboard/session?id=` shows
one session: the messages, the answers, the judge's votes, score and hint.

Every user text (prompts, answers, judge replies) reaches the browser as JSON
and is put on the page with `textContent`, never as HTML; a strict
Content-Security-Policy (scripts and styles from this server only, no inline
script) is a second fence.

Auth, when `server.api_key` is set: `Authorization: Bearer <key>` as for /v1,
or, for a browser, the key typed once into the login form the page shows
(`POST /dashboard/login`), which sets an HttpOnly, SameSite=Strict cookie
holding an HMAC of the key (never the key, and never in a URL, so never in a
log or the browser history). See docs/security.md.

With users on (`server.users`, docs/users.md) each user logs in with their own key and sees their
own sessions and experiences only (another's session is a 404, as an unknown one is); the figures
of the policy (versions, rewards, sample counts) are the shared policy's, trained on every user's
samples until each user has an adapter. The admin key sees every user's.
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from clawrl.api.auth import COOKIE, Keys, browser_guard, caller_of, dashboard_token
from clawrl.api.errors import NotFound, Unauthorized
from clawrl.api.state import OFF, Snapshot, to_json

STATIC = resources.files("clawrl.api") / "static"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
PAGES = ("dashboard.html", "session.html", "login.html")
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOGIN_FAILED = "That is not this server's API key."
MAX_LOGIN_BYTES = 4096


def dashboard_router(keys: Keys) -> APIRouter:
    router = APIRouter(prefix="/dashboard", include_in_schema=False)
    guard = browser_guard(keys)
    files = {name: (STATIC / name).read_bytes() for name in (*PAGES, *ASSETS)}

    def page(name: str, status: int = 200, note: str = "") -> Response:
        body = files[name].replace(b"<!--note-->", note.encode())  # `note`: fixed text, never a user's
        return Response(body, status, media_type="text/html; charset=utf-8", headers=HEADERS)

    async def authorized(request: Request) -> bool:
        try:
            await guard(request)
        except Unauthorized:  # the page shows the login form instead
            return False
        return True

    @router.get("")
    async def dashboard(request: Request) -> Response:
        return page("dashboard.html") if await authorized(request) else page("login.html", 401)

    @router.get("/session")
    async def session_page(request: Request) -> Response:
        return page("session.html") if await authorized(request) else page("login.html", 401)

    @router.post("/login")
    async def login(request: Request) -> Response:
        body = await request.body()
        given = parse_qs(body[:MAX_LOGIN_BYTES].decode(errors="replace")).get("key", [""])[0]
        if keys.required and keys.who(given) is None:
            return page("login.html", 401, LOGIN_FAILED)
        response = RedirectResponse("/dashboard", status_code=303, headers=HEADERS)
        if keys.required:
            response.set_cookie(
                COOKIE, dashboard_token(given), path="/dashboard", httponly=True, samesite="strict"
            )
        return response

    @router.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise NotFound(f"no dashboard asset {name!r}")
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)

    @router.get("/state.json", dependencies=[Depends(guard)])
    async def state(request: Request) -> JSONResponse:
        pipeline, owner = request.app.state.pipeline, caller_of(request).owner
        snap = await pipeline.snapshot() if owner is None else await pipeline.snapshot_for(owner)
        return JSONResponse(state_json(snap), headers=HEADERS)

    @router.get("/session.json", dependencies=[Depends(guard)])
    async def session(request: Request, id: str = "") -> JSONResponse:
        owner = caller_of(request).owner
        found: dict[str, Any] | None = await request.app.state.pipeline.session(id, owner)
        if found is None:
            raise NotFound(f"no session {id[:80]!r} in this run", param="id", code="session_not_found")
        return JSONResponse(to_json(found), headers=HEADERS)

    return router


def state_json(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as state.json shows it (`dashboard.js` and scrapers read these names): the served
    version with its fingerprint, the engine's counters with `max_batch_size`, an absent judge or
    trainer as `{"status": "off"}` (the trainer's with `batch_size` and `latest` still)."""
    t = snap.trainer
    body: dict[str, Any] = to_json(
        {
            "now": snap.now,
            "model": snap.model,
            "method": snap.method,
            "served": to_json(snap.served) | {"fingerprint": snap.fingerprint},
            "engine": to_json(snap.engine) | {"max_batch_size": snap.max_batch_size},
            "judge": OFF if snap.judge is None else snap.judge,
            "trainer": (OFF if t.health is None else to_json(t.health))
            | {"batch_size": t.batch_size, "latest": t.latest},
            "store": snap.store,
        }
    )
    return body
