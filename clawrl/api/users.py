"""Forgetting a user while the server runs: the admin's `DELETE /v1/users/{name}/data` (docs/users.md).

    DELETE /v1/users/{name}/data   {"object": "user.erased", "user", "erased": {kind: count},
                                    "checkpoints_removed", "shared_versions", "served": "v0"}

Erases what the store keeps of `name` (their sessions, turns, ratings, judgments, samples, episodes,
experiences and own versions: `clawrl/store/erase.py`, secure delete, the write-ahead log truncated)
and their folder of versions, while serving, in this order:

1. the trainer is stopped (`TrainerSupervisor.paused`): a step in flight on their samples never
   publishes, and the trainer started afterwards holds nothing of theirs;
2. their open sessions leave the session tracker and the rows are deleted on the store's thread,
   after every write made before (`Collector.erase_user`); `checkpoints/<name>/` is removed;
3. the engine forgets them (`Engine.forget_user`): their adapter is dropped (they are served v0),
   their prefix-cache entries dropped (local) or made unreachable (vLLM's cache salt); the version
   watcher forgets what it passed over on their line;
4. the trainer starts again.

A user who stays in the users file goes on from v0 with nothing of the past: their key still works,
their next answer is the base's (`system_fingerprint` `clawrl-v0`). The versions of the shared
policy (the default user's line) whose manifests list one of their samples learnt from them and are
kept: the answer names them in `shared_versions` rather than keep them silently.

Refused: a key that is not the admin's, 403 (a user cannot erase anyone, themselves included: the
operator answers for the run folder); `default` (the admin's own user, and every row from before
users), 400; a name that is no user in the users file and has nothing in the store, 404 naming the
users; while writes wait for the store, 503. One erase runs at a time.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from clawrl.api.auth import Keys, bearer_guard, caller_of
from clawrl.api.body import guarded_json_route
from clawrl.api.errors import BadRequest, Forbidden, NotFound, documented_errors
from clawrl.collect.collector import Collector
from clawrl.engine.base import Engine
from clawrl.engine.watcher import VersionWatcher
from clawrl.store.erase import remove_checkpoints, shared_versions_trained_on, user_folder
from clawrl.train.supervisor import TrainerSupervisor
from clawrl.types import DEFAULT_USER

log = logging.getLogger(__name__)


class UserEraser:
    """Erases one user's data while serving (see the module); built by the server with a store."""

    def __init__(
        self,
        collector: Collector,
        engine: Engine,
        *,
        users: frozenset[str],
        run_dir: Path,
        watcher: VersionWatcher | None = None,
        trainer: TrainerSupervisor | None = None,
    ) -> None:
        self.collector, self.engine, self.watcher, self.trainer = collector, engine, watcher, trainer
        self.users = users  # the users in the users file (docs/users.md), `default` not among them
        self.run_dir = Path(run_dir)
        self._one = asyncio.Lock()

    async def erase(self, name: str) -> dict[str, Any]:
        if name == DEFAULT_USER:
            raise BadRequest(
                f"{DEFAULT_USER} is the admin key's own user (and every row from before users): never erased",
                param="name",
            )
        async with self._one:
            await self._known(name)
            self.collector.admit()  # 503 now, before the trainer stops, while writes wait for the store
            async with self._trainer_paused():
                erased, trained = await self.collector.erase_user(name)
                removed = remove_checkpoints(self.run_dir, name)
                await self.engine.forget_user(name)
                if self.watcher is not None:
                    self.watcher.forget(name)
        shared = shared_versions_trained_on(self.run_dir, trained)
        log.info("erased %s's data while serving: %s", name, erased)
        return {
            "object": "user.erased",
            "user": name,
            "erased": erased,
            "checkpoints_removed": removed is not None,
            "shared_versions": shared,
            "served": self.engine.version_of(name) if name in self.users else None,
        }

    async def _known(self, name: str) -> None:
        """NotFound unless `name` is a user of the users file, or one removed from it whose data stays."""
        if name in self.users:
            return
        try:
            folder = user_folder(self.run_dir, name)
        except ValueError:
            folder = None
        store = self.collector.store
        rows = await self.collector.db(store.user_rows, name) if folder is not None else {}
        if not any(rows.values()) and not (folder is not None and folder.exists()):
            stored = await self.collector.db(store.users_with_rows)
            listed = ", ".join(sorted((self.users | stored) - {DEFAULT_USER})) or "none"
            raise NotFound(f"no user {name!r} (the users: {listed})", param="name", code="user_not_found")

    def _trainer_paused(self) -> AbstractAsyncContextManager[Any]:
        return self.trainer.paused() if self.trainer is not None else nullcontext()


def users_router(keys: Keys) -> APIRouter:
    router = APIRouter(
        prefix="/v1/users",
        route_class=guarded_json_route(bearer_guard(keys)),
        responses=documented_errors(400, 401, 403, 404, 503),
    )

    @router.delete("/{name}/data")
    async def erase(name: str, request: Request) -> dict[str, Any]:
        if not caller_of(request).admin:
            raise Forbidden("erasing a user's data needs the admin key", code="admin_key_required")
        eraser: UserEraser | None = request.app.state.eraser
        if eraser is None:
            raise NotFound("erasing needs collection on (collect.enabled = true)", code="collect_disabled")
        return await eraser.erase(name)

    return router
