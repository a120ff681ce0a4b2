"""The FastAPI application: engine, chat service and collector, started in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from transformers import PreTrainedTokenizerBase

from clawrl.api.collect import Collector
from clawrl.api.completions import ChatService
from clawrl.api.errors import install_error_handlers
from clawrl.api.routes import health_router, v1_router
from clawrl.config import Config
from clawrl.engine.base import Engine
from clawrl.sessions.tracker import SessionTracker
from clawrl.sessions.turn_type import SidePatterns
from clawrl.store.db import Store

log = logging.getLogger(__name__)


def create_app(
    config: Config, engine: Engine, tokenizer: PreTrainedTokenizerBase, store: Store | None = None
) -> FastAPI:
    """The app. With a store, every turn is collected; without one, the server only serves."""
    server = config.server
    collector = _collector(config, store) if store is not None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        if collector is not None:
            await collector.start()
        log.info(
            "serving %r (%s) on http://%s:%s/v1",
            server.served_model_name,
            engine.version,
            server.host,
            server.port,
        )
        try:
            yield
        finally:
            if collector is not None:
                await collector.stop()
            await engine.stop()

    app = FastAPI(title="clawrl", lifespan=lifespan)
    app.state.chat = ChatService(
        engine, tokenizer, server.served_model_name, server.default_max_tokens, collector
    )
    install_error_handlers(app)
    api_key = server.api_key.get_secret_value() if server.api_key else None
    app.include_router(v1_router(api_key))
    app.include_router(health_router())
    return app


def _collector(config: Config, store: Store) -> Collector:
    c = config.collect
    tracker = SessionTracker(SidePatterns(c.side_patterns), c.idle_timeout_s, c.max_open_sessions)
    return Collector(store, tracker, c.idle_timeout_s, c.expire_every_s)
