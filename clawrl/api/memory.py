"""Memory's routes: the key's own experiences, to see and to erase (docs/memory.md).

    GET    /v1/memory[?state=active|distilled|retired]  {"object": "list", "data": [experience, ...]}
    DELETE /v1/memory/{id}                               {"id", "object", "deleted": true, "state": "retired"}

An experience is `{"id", "object": "memory.experience", "text", "state", "seen", "created_at",
"last_seen", "retired_at", "gap", "probed_at", "turn_ids", "session_ids", "from_comment"}`, last
seen first (`gap`: the retirement probe's last measure, null until one ran; `from_comment`: taught
by its owner's rating comment, so injected without a second session). An erased experience is
retired, not deleted: it is never injected again, its pending samples are dropped, and it is
still listed (state "retired") with its provenance. An unknown id, or one that is not the
key's, is a 404. With users on (docs/users.md) the key's own are its user's; the admin key's are
every user's, each with its `owner`. A chat request opts out of memory with `"memory": false` in
its body or an `X-Memory: off` header, and asks for it on a side turn too with `"memory": true` or
`X-Memory: on` (`memory_wanted`; `clawrl eval` measures its held-out answers, side turns, so).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import Headers

from clawrl.api.auth import Keys, bearer_guard, caller_of
from clawrl.api.body import guarded_json_route
from clawrl.api.errors import BadRequest, NotFound, documented_errors
from clawrl.api.schemas import ChatCompletionRequest
from clawrl.collect.memory import MemoryBook
from clawrl.types import EXPERIENCE_ACTIVE, EXPERIENCE_DISTILLED, EXPERIENCE_RETIRED, Experience

STATES = (EXPERIENCE_ACTIVE, EXPERIENCE_DISTILLED, EXPERIENCE_RETIRED)
_ON, _OFF = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def memory_router(keys: Keys) -> APIRouter:
    router = APIRouter(
        prefix="/v1/memory",
        route_class=guarded_json_route(bearer_guard(keys)),
        responses=documented_errors(400, 401, 404, 503),
    )

    @router.get("")
    async def listed(request: Request, state: str | None = None) -> dict[str, Any]:
        if state is not None and state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}", param="state")
        caller = caller_of(request)
        found = await _book(request).experiences(state, caller.owner)
        return {"object": "list", "data": [experience_body(e, caller.several) for e in found]}

    @router.delete("/{experience_id}")
    async def forget(experience_id: str, request: Request) -> dict[str, Any]:
        book = _book(request)
        if not experience_id.isdigit():
            raise NotFound(f"no experience {experience_id!r} in your memory", param="id", code="not_found")
        gone = await book.forget(int(experience_id), caller_of(request).owner)
        return {"id": gone.id, "object": "memory.experience", "deleted": True, "state": gone.state}

    return router


def memory_wanted(headers: Headers, body: ChatCompletionRequest) -> bool | None:
    """What the request asks of memory: False when it opts out (`X-Memory: off` or `"memory":
    false`), True when it asks for the block even on a side turn (`on` / `true`), None when it says
    nothing (main turns get the block). The header wins over the body."""
    header = headers.get("x-memory")
    if header is not None:
        value = header.strip().lower()
        if value not in _ON | _OFF:
            raise BadRequest("X-Memory must be on or off", param="X-Memory")
        return value in _ON
    return body.memory


def experience_body(e: Experience, owner: bool = False) -> dict[str, Any]:
    """An experience as the API shows it; `owner`: with its owner (a server with users)."""
    fields = dataclasses.asdict(e)
    if not owner:
        del fields["owner"]
    return {"id": e.id, "object": "memory.experience"} | fields


def _book(request: Request) -> MemoryBook:
    book: MemoryBook | None = request.app.state.memory
    if book is None:
        raise NotFound("memory needs collection on (collect.enabled = true)", code="collect_disabled")
    return book
