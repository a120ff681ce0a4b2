"""Building a replica set from the config: one vLLM engine per URL of `engine.vllm.urls`.

Attached (`engine.vllm.start = false`): each URL is a vLLM server already running, started with
the flags docs/vllm.md lists and the same key (`engine.vllm.api_key`). Started
(`engine.vllm.start = true`): clawrl starts one vLLM per URL, on that URL's port of 127.0.0.1,
each with its own key and log (`<run_dir>/logs/vllm-<port>.log`) and supervised on its own; the
servers start side by side. Every replica must answer before the gateway serves (else
`VLLMUnavailable`: `clawrl serve` exits 2, and the servers started are stopped). Started replicas
are for a CPU machine: on GPUs, start each vLLM on its own GPU and attach them.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from clawrl.config import Config
from clawrl.engine.replicas.engine import ReplicaEngine
from clawrl.engine.vllm.build import ServedModel, served_model, started_server, vllm_engine
from clawrl.engine.vllm.server import VLLMServer, VLLMUnavailable

log = logging.getLogger(__name__)


def replica_servers(config: Config, served: ServedModel) -> list[VLLMServer]:
    """One server per URL: attached, or to be started on the URL's port (not started yet)."""
    v = config.engine.vllm
    if not v.start:
        return [VLLMServer(v, url) for url in v.urls]
    if config.engine.gpu_share is not None:
        raise VLLMUnavailable(
            "engine.vllm.urls with start = true starts several vLLM servers on this CPU only; on GPUs, "
            "start each vLLM on its own GPU and attach them by engine.vllm.urls (docs/vllm.md)"
        )
    servers = []
    for url in v.urls:
        port = urlsplit(url).port or 80
        log_path = config.run_dir / "logs" / f"vllm-{port}.log"
        servers.append(started_server(config, served, port=port, log_path=log_path))
    return servers


def connect_all(servers: list[VLLMServer]) -> None:
    """Start every server (in this thread: `VLLMServer.launch` says why), then wait for them all
    side by side; any failure stops them all and is raised."""
    for server in servers:
        server.launch()
    with ThreadPoolExecutor(len(servers)) as pool:
        waits = [pool.submit(s.connect, launched=True) for s in servers]
        failures = [f.exception() for f in waits]
    failed = [exc for exc in failures if exc is not None]
    if failed:
        for server in servers:
            server.close()
        raise failed[0]


def build_replica_engine(config: Config) -> tuple[ReplicaEngine, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per token stream and health poll
    served = served_model(config)
    servers = replica_servers(config, served)
    connect_all(servers)
    engines = [vllm_engine(config, server, served) for server in servers]
    log.info("serving on %d vLLM replicas: %s", len(engines), ", ".join(s.url for s in servers))
    return ReplicaEngine(engines, poll_s=config.engine.vllm.health_poll_s), served.loaded.tokenizer
