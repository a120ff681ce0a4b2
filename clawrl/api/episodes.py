"""Track 2's route: `POST /v1/episodes` records a finished episode and its reward.

An environment runner (clawrl/envs, or any client) runs an episode as one session
(`X-Session-Id` on each of its chat requests) and posts, when it ends:

    {"session_id", "group_id", "group_size", "reward" (a finite number, or null when the
     episode was dropped; "reason" then says why), "reason", "task", "env", "turns",
     "tool_calls", "info", "train"}

The answer is the episode and its group: `received` of `size` episodes so far and the
group's `status` (`open`, then `used` with its samples, `dropped` with the reason, or
`eval` for evaluation episodes). 404: no such session was recorded; 409: the session's
episode was posted before, or the group was posted with another size.
`GET /v1/episodes/groups/{group_id}` reads a group back.
`POST /v1/episodes/groups/{group_id}/close` (`{"reason": ...}`) closes an open group now, with
the episodes it has, when the others will never be posted (they never reached the server);
a group closed already is answered as it is; 404 for a group never recorded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from clawrl.api.auth import Keys, bearer_guard, caller_of
from clawrl.api.body import guarded_json_route
from clawrl.api.errors import NotFound, documented_errors
from clawrl.api.schemas import SESSION_ID_PATTERN
from clawrl.collect.episodes import EpisodeBook
from clawrl.types import Episode, Group

MAX_GROUP_SIZE = 1024


class EpisodeRequest(BaseModel):
    """POST /v1/episodes: one finished episode of an environment."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    session_id: str = Field(pattern=SESSION_ID_PATTERN, description="The session its chat requests used.")
    group_id: str = Field(pattern=SESSION_ID_PATTERN, description="Its group: G episodes of one task.")
    group_size: int = Field(ge=1, le=MAX_GROUP_SIZE, description="G: the group closes when G are in.")
    reward: float | None = Field(description="The environment's reward; null: dropped (say why in reason).")
    reason: str | None = Field(None, max_length=500, description="How it ended, or why it was dropped.")
    task: str | None = Field(None, max_length=500)
    env: str | None = Field(None, max_length=200)
    turns: int = Field(0, ge=0, le=1_000_000)
    tool_calls: int = Field(0, ge=0, le=1_000_000)
    info: dict[str, Any] = Field(default_factory=dict, description="Anything else the runner reports.")
    train: bool = Field(True, description="False for an evaluation episode: recorded, never trained on.")

    def episode(self, session_id: str) -> Episode:
        """The episode, of the session stored as `session_id` (`Caller.session_id`: with users on,
        the admin's sessions are `default/<name>`)."""
        return Episode(**self.model_dump() | {"session_id": session_id})


class CloseRequest(BaseModel):
    """POST /v1/episodes/groups/{group_id}/close: close an open group with the episodes it has."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=500, description="Why the other episodes never came.")


def episodes_router(keys: Keys) -> APIRouter:
    """Track 2's routes; with users on, the admin key's alone (an environment runner's, docs/users.md)."""
    router = APIRouter(
        prefix="/v1/episodes",
        route_class=guarded_json_route(bearer_guard(keys, admin_only=True)),
        responses=documented_errors(400, 401, 404, 409, 413, 503),
    )

    @router.post("")
    async def record(body: EpisodeRequest, request: Request) -> dict[str, Any]:
        book = _book(request)
        group = await book.record(body.episode(caller_of(request).session_id(body.session_id)))
        return {"object": "episode", "session_id": body.session_id, "group": group_body(group)}

    @router.post("/groups/{group_id}/close")
    async def close(group_id: str, request: Request, body: CloseRequest | None = None) -> dict[str, Any]:
        book = _book(request)
        return group_body(await book.close(group_id, body.reason if body else None))

    @router.get("/groups/{group_id}")
    async def group(group_id: str, request: Request) -> dict[str, Any]:
        book = _book(request)
        found = await book.db(book.store.group, group_id)
        if found is None:
            raise NotFound(f"no group {group_id!r} was recorded", param="group_id", code="group_not_found")
        episodes = await book.db(book.store.group_episodes, group_id)
        return group_body(found) | {"episodes": [_episode_body(e) for e in episodes]}

    return router


def _book(request: Request) -> EpisodeBook:
    book: EpisodeBook | None = request.app.state.episodes
    if book is None:
        raise NotFound("episodes need collection on (collect.enabled = true)", code="collect_disabled")
    return book


def group_body(group: Group) -> dict[str, Any]:
    return {"object": "episode.group"} | dataclasses.asdict(group)


def _episode_body(episode: Episode) -> dict[str, Any]:
    return dataclasses.asdict(episode) | {"status": episode.status}
