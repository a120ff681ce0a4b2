"""Every engine, by `engine.kind`: the one place that knows which engines exist.

Each entry names the function that builds that engine from the config and returns
`(engine, tokenizer)`; it is imported only when its kind is asked for, so the local
engine never loads vLLM's client code and the other way round. A builder that cannot
build its engine raises `EngineUnavailable` (`clawrl serve` exits 2 with the reason).
Adding an engine is one package under `clawrl/engine/`, one line here and one config
section (docs/design.md, "Adding an engine"); `engine.kind`'s choices in the config
are checked against this table by the tests; `REPLICA_SETS` builds a kind as several servers
behind one gateway (clawrl/engine/replicas). `engine.kind = "auto"` is decided here too,
once, at start (`resolve_kind`, by `clawrl/engine/choice.py`'s table).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from clawrl.config import Config
from clawrl.engine.base import Engine
from clawrl.engine.choice import choose, resolved, vllm_python_path

log = logging.getLogger(__name__)

ENGINES: dict[str, str] = {
    "local": "clawrl.engine.local.build:build_local_engine",
    "vllm": "clawrl.engine.vllm.build:build_vllm_engine",
}
# A kind whose section lists several servers (`engine.vllm.urls`) is built as a replica set.
REPLICA_SETS: dict[str, str] = {"vllm": "clawrl.engine.replicas.build:build_replica_engine"}


def resolve_kind(config: Config, cuda: bool) -> Config:
    """`config` with `engine.kind` decided for this machine (`cuda`: the server's device is a GPU);
    a choice worth knowing (the local engine on a GPU) is said once here."""
    choice = choose(config, cuda, vllm_python_path(config, cuda).is_file())
    if choice.note is not None:
        log.warning("%s", choice.note)
    return resolved(config, choice, cuda)


def build_engine(config: Config) -> tuple[Engine, Any]:
    """The engine `engine.kind` names, and the tokenizer the gateway renders prompts with. A kind
    still "auto" (a caller that did not plan the start, `clawrl/wiring/layout.py`) is decided here."""
    if config.engine.kind == "auto":
        import torch

        from clawrl.model.gpu import cuda_index

        config = resolve_kind(config, cuda_index(config.model.device, torch.cuda.is_available()) is not None)
    try:
        target = ENGINES[config.engine.kind]
    except KeyError:
        raise ValueError(f"unknown engine.kind {config.engine.kind!r}; known: {', '.join(ENGINES)}") from None
    if config.engine.kind == "vllm" and config.engine.vllm.urls:
        target = REPLICA_SETS["vllm"]
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(config)
