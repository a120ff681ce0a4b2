"""The FastAPI application: engine, chat service, collector, judge, version watcher and the
trainer process, all started in the lifespan and stopped, in reverse, when it ends; /metrics
and /dashboard read the `PipelineState` snapshot."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from transformers import PreTrainedTokenizerBase

from clawrl.algo import get_method
from clawrl.algo.teacher import teacher_prompt
from clawrl.api.body import BodyLimit
from clawrl.api.collect import Collector
from clawrl.api.completions import ChatService
from clawrl.api.dashboard import dashboard_router
from clawrl.api.errors import install_error_handlers, without_422
from clawrl.api.metrics import Metrics, MetricsMiddleware, metrics_router
from clawrl.api.routes import health_router, v1_router
from clawrl.api.state import PipelineState
from clawrl.api.versions import VersionWatcher
from clawrl.config import Config
from clawrl.engine.base import Engine
from clawrl.engine.chat import ChatRenderer
from clawrl.engine.local import LocalEngine
from clawrl.judge.backends import JudgeBackend, LocalJudge, OpenAIJudge
from clawrl.judge.worker import JudgeLoop
from clawrl.sessions.injected import InjectedContext
from clawrl.sessions.tracker import SessionTracker
from clawrl.sessions.turn_type import SidePatterns
from clawrl.store.db import Store
from clawrl.store.writer import StoreWriter
from clawrl.train.supervisor import TrainerSupervisor

log = logging.getLogger(__name__)


def create_app(
    config: Config, engine: Engine, tokenizer: PreTrainedTokenizerBase, store: Store | None = None
) -> FastAPI:
    """The app. With a store, every turn is collected; without one, the server only serves."""
    server = config.server
    collector = _collector(config, store) if store is not None else None
    if collector is not None and config.judge.enabled:
        collector.judge = _judge(config, collector, engine, tokenizer)
    trainer = None
    if collector is not None and config.train.enabled:
        # The resolved config.json `clawrl serve` wrote: the trainer trains exactly what is served.
        trainer = TrainerSupervisor(config.run_dir / "config.json", config.run_dir, config.train)
    pipeline = PipelineState(
        engine,
        model=server.served_model_name,
        method=config.method,
        max_batch_size=config.engine.max_batch_size,
        batch_size=config.train.batch_size if trainer is not None else None,
        store_path=store.path if store is not None else None,
        judge=collector.judge if collector is not None else None,
        trainer=trainer,
    )
    metrics = Metrics(pipeline)
    watcher = None
    if collector is not None:
        t = config.train
        eager = t.enabled and t.weights == "lora" and isinstance(engine, LocalEngine)
        watcher = VersionWatcher(
            engine, collector.store, collector.db, t.lora.targets, t.swap_poll_s, eager, metrics.swapped
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        if collector is not None:
            await collector.start()
            if collector.judge is not None:
                await collector.judge.start()
        if watcher is not None:
            await watcher.start()
        if trainer is not None:
            await trainer.start()
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
            if trainer is not None:
                await trainer.stop()
            if watcher is not None:
                await watcher.stop()
            if collector is not None:
                if collector.judge is not None:
                    await collector.judge.stop()
                await collector.stop()
            await engine.stop()
            pipeline.close()

    # No /docs or /redoc: they pull Swagger's JavaScript from a CDN; /openapi.json describes the API.
    app = FastAPI(title="clawrl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=server.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: times every request whole
    app.state.watcher, app.state.guard = watcher, config.guard
    app.state.chat = ChatService(
        engine, tokenizer, server.served_model_name, server.default_max_tokens, collector
    )
    app.state.trainer = trainer
    app.state.pipeline, app.state.metrics = pipeline, metrics
    app.state.affinity_keys = config.collect.affinity_keys
    install_error_handlers(app)
    api_key = server.api_key.get_secret_value() if server.api_key else None
    app.include_router(v1_router(api_key))
    app.include_router(health_router())
    app.include_router(metrics_router(api_key))
    app.include_router(dashboard_router(api_key))
    app.openapi = lambda: without_422(app)  # type: ignore[method-assign]
    return app


def _collector(config: Config, store: Store) -> Collector:
    c = config.collect
    tracker = SessionTracker(
        SidePatterns(c.side_patterns),
        c.idle_timeout_s,
        c.max_open_sessions,
        injected=InjectedContext(c.context_patterns),
    )
    writer = StoreWriter(c.retry_every_s, c.max_pending_writes)
    return Collector(store, tracker, c.idle_timeout_s, c.expire_every_s, writer)


def _judge(
    config: Config, collector: Collector, engine: Engine, tokenizer: PreTrainedTokenizerBase
) -> JudgeLoop:
    j = config.judge
    renderer = ChatRenderer(tokenizer)
    backend: JudgeBackend | None = None
    if j.backend == "local":
        backend = LocalJudge(engine, renderer)
    elif j.backend == "openai":
        assert j.base_url and j.model  # checked by the config
        key = j.api_key.get_secret_value() if j.api_key else None
        backend = OpenAIJudge(j.base_url, j.model, key, j.timeout_s)
    method = get_method(config.method)
    return JudgeLoop(collector.store, collector.writer, backend, method, teacher_prompt(renderer), j)
