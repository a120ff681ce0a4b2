"""The FastAPI application over services built elsewhere (`clawrl/wiring/server.py`).

The app owns no service: it is handed them, starts them in its lifespan in the
order given and stops them in reverse when it ends, and puts on `app.state` what
the routes read. /metrics and /dashboard read the `PipelineState` snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI

from clawrl.api.auth import Keys
from clawrl.api.body import BodyLimit
from clawrl.api.completions import ChatService
from clawrl.api.dashboard import dashboard_router
from clawrl.api.episodes import episodes_router
from clawrl.api.errors import install_error_handlers, without_422
from clawrl.api.health import HealthReport
from clawrl.api.memory import memory_router
from clawrl.api.metrics import Metrics, MetricsMiddleware, metrics_router
from clawrl.api.routes import health_router, v1_router
from clawrl.api.state import PipelineState
from clawrl.api.trainer import UPLOADS, trainer_router
from clawrl.api.users import UserEraser, users_router
from clawrl.collect.episodes import EpisodeBook
from clawrl.collect.memory import MemoryBook
from clawrl.train.remote.desk import TrainerDesk

log = logging.getLogger(__name__)


class Service(Protocol):
    """Anything started with the app and stopped with it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class Routes:
    """What the routes read from `app.state`."""

    chat: ChatService
    pipeline: PipelineState
    metrics: Metrics
    health: HealthReport
    affinity_keys: bool
    keys: Keys  # the admin key and the users' (docs/users.md)
    max_body_bytes: int
    episodes: EpisodeBook | None = None  # Track 2's POST /v1/episodes (None: collection is off)
    memory: MemoryBook | None = None  # GET and DELETE /v1/memory (None: collection is off)
    eraser: UserEraser | None = None  # DELETE /v1/users/{name}/data (None: collection is off)
    trainer_desk: TrainerDesk | None = None  # /v1/trainer (None: a trainer of its own, or no store)


def create_app(
    routes: Routes, services: Sequence[Service], banner: Callable[[], str] | None = None
) -> FastAPI:
    """The app: `services` started in order in the lifespan, stopped in reverse; `banner()` logged
    once they all run."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started: list[Service] = []
        try:
            for service in services:
                await service.start()
                started.append(service)
            if banner is not None:
                log.info("%s", banner())
            yield
        finally:
            for service in reversed(started):
                await service.stop()
            routes.pipeline.close()

    # No /docs or /redoc: they pull Swagger's JavaScript from a CDN; /openapi.json describes the API.
    app = FastAPI(title="clawrl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=routes.max_body_bytes, exempt=(UPLOADS,))
    app.add_middleware(MetricsMiddleware, metrics=routes.metrics)  # outermost: times every request whole
    app.state.chat, app.state.health = routes.chat, routes.health
    app.state.pipeline, app.state.metrics = routes.pipeline, routes.metrics
    app.state.affinity_keys = routes.affinity_keys
    app.state.episodes = routes.episodes
    app.state.memory = routes.memory
    app.state.eraser = routes.eraser
    app.state.trainer_desk = routes.trainer_desk
    install_error_handlers(app)
    app.include_router(v1_router(routes.keys))
    app.include_router(episodes_router(routes.keys))
    app.include_router(memory_router(routes.keys))
    app.include_router(users_router(routes.keys))
    app.include_router(trainer_router(routes.keys))
    app.include_router(health_router(routes.keys))
    app.include_router(metrics_router(routes.keys))
    app.include_router(dashboard_router(routes.keys))
    app.openapi = lambda: without_422(app)  # type: ignore[method-assign]
    return app
