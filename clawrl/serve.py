"""Start the server: load the model (or reach vLLM), build the engine and the app, run uvicorn."""

from __future__ import annotations

import logging
from typing import Any

import torch
import uvicorn

from clawrl.api.app import create_app
from clawrl.config import Config
from clawrl.engine.base import Engine
from clawrl.engine.local import LocalEngine
from clawrl.engine.models import ModelNotFound, load_model, model_folder, served_context
from clawrl.engine.prefix_cache import PrefixCache
from clawrl.engine.vllm_server import VLLMUnavailable
from clawrl.store.db import Store, StoreError

log = logging.getLogger(__name__)


def build_engine(config: Config) -> tuple[Engine, Any]:
    """The engine `engine.kind` names, and the tokenizer the gateway renders prompts with."""
    if config.engine.kind == "vllm":
        from clawrl.engine.vllm_setup import build_vllm_engine

        return build_vllm_engine(config)
    return build_local_engine(config)


def build_local_engine(config: Config) -> tuple[LocalEngine, Any]:
    if config.engine.threads:
        torch.set_num_threads(config.engine.threads)
    folder = model_folder(config.model.path, config.cache_dir())
    m = config.model
    loaded = load_model(folder, m.device, m.dtype, served_context(m.path, m.max_context), m.rope_scaling)
    log.info("loaded %s on %s (context %d)", folder, loaded.model.device, loaded.max_context)
    e = config.engine
    cache = None
    if e.prefix_cache_mb:
        cache = PrefixCache(e.prefix_cache_mb << 20, e.prefix_cache_across_versions)
    engine = LocalEngine(
        loaded.model,
        model_name=config.server.served_model_name,
        max_context=loaded.max_context,
        stop_token_ids=loaded.stop_token_ids,
        max_batch_size=config.engine.max_batch_size,
        max_prefill_tokens=config.engine.max_prefill_tokens,
        max_background_rows=config.engine.max_background_rows,
        prefill_chunk=config.engine.prefill_chunk,
        prefix_cache=cache,
    )
    return engine, loaded.tokenizer


def open_store(config: Config) -> Store | None:
    """The run's database, opened (and proven writable) before anything is served."""
    if not config.collect.enabled:
        return None
    return Store.open(config.run_dir / "clawrl.db", busy_timeout_s=config.collect.write_wait_s)


def run_server(config: Config) -> int:
    try:
        store = open_store(config)
    except StoreError as exc:
        log.error("cannot record conversations: %s", exc)
        return 2
    try:
        engine, tokenizer = build_engine(config)
    except (ModelNotFound, VLLMUnavailable) as exc:
        log.error("%s", exc)
        return 2
    app = create_app(config, engine, tokenizer, store)
    try:
        uvicorn.run(
            app,
            host=config.server.host,
            port=config.server.port,
            log_level=config.server.log_level,
            log_config=None,  # uvicorn's loggers go through ours: console and logs/server.log
            timeout_graceful_shutdown=5,
        )
    finally:
        close = getattr(engine, "close", None)
        if close is not None:  # a vLLM server clawrl started goes with it, whatever happened
            close()
        if store is not None:
            store.close()
    return 0
