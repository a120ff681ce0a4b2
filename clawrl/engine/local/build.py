"""Building the local engine from the config: load the model (the embedded one by default) in
this process, with its RoPE scaled to `model.max_context`, and its prefix cache.

The local engine merges published LoRA versions into its live weights; a server that
trains LoRA copies the base weights it merges over at start (`merge_eagerly`), so the
first swap does not pay for the copy.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from clawrl.config import Config
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.local.prefix_cache import PrefixCache
from clawrl.model.load import generation_defaults, load_model, model_folder, served_context

log = logging.getLogger(__name__)


def prefix_cache_budget(configured_mb: int | None, model: Any) -> int:
    """The prefix cache's budget in bytes: the configured MiB, else 1 GiB on a CPU and a quarter
    of the free memory of the model's GPU (the KV stays on the model's device)."""
    if configured_mb is not None:
        return configured_mb << 20
    device = next(model.parameters()).device
    if device.type != "cuda":
        return 1024 << 20
    free, _ = torch.cuda.mem_get_info(device)
    budget = max(1024 << 20, free // 4)
    log.info("prefix cache: %.1f GiB on %s (a quarter of its free memory)", budget / (1 << 30), device)
    return budget


def build_local_engine(config: Config) -> tuple[LocalEngine, Any]:
    """The local engine and the tokenizer the gateway renders prompts with."""
    e, m, t = config.engine, config.model, config.train
    if e.threads:
        torch.set_num_threads(e.threads)
    folder = model_folder(m.path, config.cache_dir())
    context = served_context(m.path, m.max_context)
    loaded = load_model(folder, m.device, m.dtype, context, m.rope_scaling, m.scale_rope)
    log.info("loaded %s on %s (context %d)", folder, loaded.model.device, loaded.max_context)
    budget = prefix_cache_budget(e.prefix_cache_mb, loaded.model)
    cache = PrefixCache(budget, e.prefix_cache_across_versions) if budget else None
    engine = LocalEngine(
        loaded.model,
        model_name=config.server.served_model_name,
        max_context=loaded.max_context,
        stop_token_ids=loaded.stop_token_ids,
        max_batch_size=e.max_batch_size,
        max_prefill_tokens=e.max_prefill_tokens,
        max_background_rows=e.max_background_rows,
        background_share=e.background_share,
        prefill_chunk=e.prefill_chunk,
        prefix_cache=cache,
        lora_targets=t.lora.targets,
        merge_eagerly=config.collect.enabled and t.enabled and t.weights == "lora",
        sampling_defaults=generation_defaults(folder, config.model.repetition_guard),
        constrained_decoding=e.constrained_decoding,
    )
    return engine, loaded.tokenizer
