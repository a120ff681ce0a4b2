"""The server process, wired in one place: open the store, build the engine through the
registry, build each service with its collaborators, hand them to the app, run uvicorn.

    store ─┬─ Collector (SessionTracker, StoreWriter, JudgeLoop)
           ├─ EpisodeBook (the Collector, the grpo method, the JudgeLoop): Track 2's episodes
           ├─ MemoryBook (the Collector, the tokenizer): experiences for prompts, /v1/memory
           ├─ UserEraser (the Collector, engine, watcher, trainer): a user's data erased while serving
           ├─ JudgeLoop (a judge backend on the engine or an OpenAI-compatible server, the method)
           ├─ VersionWatcher (the engine: serves each published version)
           └─ TrainerSupervisor (the trainer process, `clawrl/wiring/trainer.py`), or with
              train.enabled false TrainerDesk (a remote trainer's lease, calls and uploads:
              `clawrl/train/remote/desk.py`, `clawrl/api/trainer.py`)
    engine ── ChatService ── the routes; PipelineState ── /metrics, /dashboard; HealthReport ── /healthz

Services start in that order (engine first) and stop in reverse (`clawrl/api/app.py`).
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn

from clawrl.algo import GroupRelative, Method, get_method
from clawrl.algo.teacher import bare_prompt, teacher_prompt
from clawrl.api.app import Routes, Service, create_app
from clawrl.api.auth import Keys
from clawrl.api.completions import ChatService
from clawrl.api.health import HealthReport
from clawrl.api.metrics import Metrics
from clawrl.api.state import PipelineState
from clawrl.api.users import UserEraser
from clawrl.chat.template import ChatRenderer
from clawrl.collect.collector import Collector
from clawrl.collect.episodes import EpisodeBook
from clawrl.collect.memory import MemoryBook
from clawrl.config import Config
from clawrl.engine.base import Engine, EngineUnavailable
from clawrl.engine.registry import build_engine
from clawrl.engine.watcher import VersionWatcher
from clawrl.judge.backends import JudgeBackend, LocalJudge, OpenAIJudge
from clawrl.judge.rewriter import REWRITE_MAX_TOKENS, engine_rewriter
from clawrl.judge.scorer import LikelihoodJudge
from clawrl.judge.worker import JudgeLoop
from clawrl.model.load import ModelNotFound
from clawrl.sessions.injected import InjectedContext
from clawrl.sessions.tracker import SessionTracker
from clawrl.sessions.turn_type import SidePatterns
from clawrl.store.db import Store, StoreError
from clawrl.store.writer import StoreWriter
from clawrl.train.remote.desk import TrainerDesk
from clawrl.train.supervisor import TrainerSupervisor
from clawrl.types import DEFAULT_USER
from clawrl.wiring.layout import StartRefused, plan_start

log = logging.getLogger(__name__)
KEEP_ALIVE_S = 75  # seconds an idle client connection is kept (as nginx's default)


def run_server(config: Config) -> int:
    """`clawrl serve`: 0 after a clean shutdown, 2 when the engine kind or the memory budget cannot
    work (`clawrl/wiring/layout.py`), or the store or the engine cannot be had."""
    try:
        config = plan_start(config)
    except (StartRefused, ModelNotFound) as exc:
        log.error("%s", exc)
        return 2
    config.write()  # the decisions, for the trainer this server starts
    try:
        store = open_store(config)
    except StoreError as exc:
        log.error("cannot record conversations: %s", exc)
        return 2
    try:
        engine, tokenizer = build_engine(config)
    except (EngineUnavailable, ModelNotFound) as exc:
        log.error("%s", exc)
        return 2
    try:
        app = build_app(config, engine, tokenizer, store)
        uvicorn.run(
            app,
            host=config.server.host,
            port=config.server.port,
            log_level=config.server.log_level,
            log_config=None,  # uvicorn's loggers go through ours: console and logs/server.log
            timeout_graceful_shutdown=5,
            # Idle connections stay open well past clients' pool expiry (httpx 5 s, Node 4-5 s):
            # at uvicorn's default 5 s a client reusing one races the server closing it.
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    finally:
        engine.close()  # a vLLM server clawrl started goes with it, whatever happened
        if store is not None:
            store.close()
    return 0


def open_store(config: Config) -> Store | None:
    """The run's database, opened (and proven writable) before anything is served."""
    if not config.collect.enabled:
        return None
    return Store.open(config.run_dir / "clawrl.db", busy_timeout_s=config.collect.write_wait_s)


def build_app(config: Config, engine: Engine, tokenizer: Any, store: Store | None) -> Any:
    """Every service of the server, each given its collaborators; without a store it only serves."""
    s = config.server
    writer = judge = collector = watcher = trainer = episodes = memory = desk = None
    if store is not None:
        writer = StoreWriter(config.collect.retry_every_s, config.collect.max_pending_writes)
        if config.judge.enabled:
            judge = build_judge(config=config, store=store, writer=writer, engine=engine, tokenizer=tokenizer)
        collector = build_collector(config, store, writer, judge)
        method = configured_method(config)
        grpo = method if isinstance(method, GroupRelative) else None
        episodes = EpisodeBook(collector, grpo, config.method, judge)
        memory = MemoryBook(collector, config.memory, token_counter(tokenizer))
        if config.train.enabled:
            # The resolved config.json `clawrl serve` wrote: the trainer trains exactly what is served.
            trainer = TrainerSupervisor(config.run_dir / "config.json", config.run_dir, config.train)
        else:  # `clawrl train --server URL` may train it from another host
            desk = TrainerDesk(
                store, collector.db, config.run_dir, train=config.train, per_user=config.per_user_adapters
            )
    pipeline = PipelineState(
        engine,
        model=s.served_model_name,
        method=config.method,
        max_batch_size=config.engine.max_batch_size,
        batch_size=config.train.batch_size if trainer is not None else None,
        store_path=store.path if store is not None else None,
        judge=judge,
        trainer=trainer,
        users=config.server.user_names if config.server.users else None,
    )
    metrics = Metrics(pipeline)
    if collector is not None:
        watcher = VersionWatcher(
            engine=engine,
            store=collector.store,
            db=collector.db,
            poll_s=config.train.swap_poll_s,
            on_swap=metrics.swapped,
            users=served_users(config),
        )
    services: list[Service] = [engine]
    services += [x for x in (collector, judge, episodes, watcher, trainer, desk) if x is not None]
    routes = Routes(
        chat=ChatService(
            engine=engine,
            tokenizer=tokenizer,
            served_model_name=s.served_model_name,
            default_max_tokens=s.default_max_tokens,
            collector=collector,
            memory=memory if config.memory.enabled else None,
            template_kwargs=config.model.chat_template_kwargs,
        ),
        pipeline=pipeline,
        metrics=metrics,
        health=HealthReport(
            engine=engine,
            model=s.served_model_name,
            collector=collector,
            judge=judge,
            trainer=trainer,
            watcher=watcher,
            guard=config.guard,
            pipeline=pipeline,
            run_dir=config.run_dir,
            memory=memory is not None and config.memory.enabled,
            desk=desk,
        ),
        affinity_keys=config.collect.affinity_keys,
        keys=server_keys(s),
        max_body_bytes=s.max_body_bytes,
        episodes=episodes,
        memory=memory,
        trainer_desk=desk,
        eraser=None
        if collector is None
        else eraser(config=config, collector=collector, engine=engine, watcher=watcher, trainer=trainer),
    )
    return create_app(
        routes,
        services,
        lambda: f"serving {s.served_model_name!r} ({engine.version}) on http://{s.host}:{s.port}/v1",
    )


def eraser(
    config: Config,
    collector: Collector,
    engine: Engine,
    watcher: VersionWatcher | None,
    trainer: TrainerSupervisor | None,
) -> UserEraser:
    """`DELETE /v1/users/{name}/data`: a user's data erased while serving (docs/users.md)."""
    users = config.server.user_names - {DEFAULT_USER}
    return UserEraser(
        collector, engine, users=users, run_dir=config.run_dir, watcher=watcher, trainer=trainer
    )


def served_users(config: Config) -> frozenset[str] | None:
    """With an adapter per user: the users whose versions are served, those in the users file and
    `default` (a user removed from it is served no more); None: the one policy for all."""
    return config.server.user_names if config.per_user_adapters else None


def server_keys(s: Any) -> Keys:
    """The admin key and, with `server.users`, the users' keys (parsed with the config; `clawrl serve`
    checked them)."""
    admin = s.api_key.get_secret_value() if s.api_key else None
    return Keys(admin, s.user_keys)


def token_counter(tokenizer: Any) -> Any:
    """How many tokens a text is to the served model (a memory block's budget is counted so)."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def build_collector(config: Config, store: Store, writer: StoreWriter, judge: JudgeLoop | None) -> Collector:
    c = config.collect
    tracker = SessionTracker(
        SidePatterns(c.side_patterns),
        c.idle_timeout_s,
        c.max_open_sessions,
        injected=InjectedContext(c.context_patterns),
    )
    return Collector(
        store=store,
        tracker=tracker,
        idle_timeout=c.idle_timeout_s,
        expire_every=c.expire_every_s,
        writer=writer,
        judge=judge,
    )


def build_judge(
    config: Config, store: Store, writer: StoreWriter, engine: Engine, tokenizer: Any
) -> JudgeLoop:
    j = config.judge
    renderer = ChatRenderer(tokenizer)
    backend: JudgeBackend | None = None
    likelihood = None
    mode = j.judge_mode
    if j.backend == "local" and mode == "likelihood":
        likelihood = LikelihoodJudge(engine, tokenizer, base=j.weights == "base")
    if j.backend == "local" and (mode == "generate" or j.hints_from == "judge"):
        backend = LocalJudge(engine, renderer)  # writes with the served weights (the config says so)
    elif j.backend == "openai":
        assert j.base_url and j.model  # checked by the config
        key = j.api_key.get_secret_value() if j.api_key else None
        backend = OpenAIJudge(j.base_url, j.model, key, j.timeout_s)
    method = configured_method(config)
    teacher = teacher_prompt(renderer, config.train.hint_placement)
    bare = bare_prompt(renderer) if config.memory_distills else None
    if config.memory.distill and bare is None:
        log.info("memory distillation off: with users and train.adapters shared, one user's memory "
                 "would be trained into the policy every user is served")  # fmt: skip
    served = lambda: engine.version  # noqa: E731
    rewrite = (
        engine_rewriter(engine, REWRITE_MAX_TOKENS, config.train.hint_rewrite_candidates)
        if config.train.hint_rewrite
        else None
    )
    return JudgeLoop(
        store=store,
        writer=writer,
        backend=backend,
        method=method,
        teacher=teacher,
        config=j,
        likelihood=likelihood,
        served=served,
        memory=config.memory,
        bare=bare,
        rewrite=rewrite,
    )


def configured_method(config: Config) -> Method:
    """The configured method, with its settings from the config (grpo's [grpo] section)."""
    if config.method == "grpo":
        return GroupRelative(**config.grpo.model_dump())
    return get_method(config.method)
