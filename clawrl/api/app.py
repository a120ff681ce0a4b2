"""The FastAPI application: one engine and one chat service, created in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from transformers import PreTrainedTokenizerBase

from clawrl.api.completions import ChatService
from clawrl.api.errors import install_error_handlers
from clawrl.api.routes import health_router, v1_router
from clawrl.config import Config
from clawrl.engine.base import Engine

log = logging.getLogger(__name__)


def create_app(config: Config, engine: Engine, tokenizer: PreTrainedTokenizerBase) -> FastAPI:
    server = config.server

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
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
            await engine.stop()

    app = FastAPI(title="clawrl", lifespan=lifespan)
    app.state.chat = ChatService(engine, tokenizer, server.served_model_name, server.default_max_tokens)
    install_error_handlers(app)
    api_key = server.api_key.get_secret_value() if server.api_key else None
    app.include_router(v1_router(api_key))
    app.include_router(health_router())
    return app
