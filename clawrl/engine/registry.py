"""Every engine, by `engine.kind`: the one place that knows which engines exist.

Each entry names the function that builds that engine from the config and returns
`(engine, tokenizer)`; it is imported only when its kind is asked for, so the local
engine never loads vLLM's client code and the other way round. A builder that cannot
build its engine raises `EngineUnavailable` (`clawrl serve` exits 2 with the reason).
Adding an engine is one package under `clawrl/engine/`, one line here and one config
section (docs/design.md, "Adding an engine"); `engine.kind`'s choices in the config
are checked against this table by the tests.
"""

from __future__ import annotations

import importlib
from typing import Any

from clawrl.config import Config
from clawrl.engine.base import Engine

ENGINES: dict[str, str] = {
    "local": "clawrl.engine.local.build:build_local_engine",
    "vllm": "clawrl.engine.vllm.build:build_vllm_engine",
}


def build_engine(config: Config) -> tuple[Engine, Any]:
    """The engine `engine.kind` names, and the tokenizer the gateway renders prompts with."""
    try:
        module, _, name = ENGINES[config.engine.kind].partition(":")
    except KeyError:
        raise ValueError(f"unknown engine.kind {config.engine.kind!r}; known: {', '.join(ENGINES)}") from None
    return getattr(importlib.import_module(module), name)(config)
