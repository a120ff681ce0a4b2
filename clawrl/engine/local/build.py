"""Building the local engine from the config: load the model (the embedded one by default) in
this process, with its RoPE scaled to `model.max_context`, and its prefix cache.

On a GPU the memory budget decided at start (clawrl/model/budget.py, written into the config by
`clawrl/wiring/layout.py`) sets what this process may hold: it caps its allocator at
`engine.gpu_share` before loading, sizes the prefix cache (`engine.prefix_cache_mb`) and admits
requests by the KV bytes of `engine.batch_kv_mb`, and prefills long prompts in chunks of
thousands of tokens (`engine.prefill_chunk`).

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
from clawrl.model.adapter_slots import local_slots
from clawrl.model.gpu import cap_process, cuda_index
from clawrl.model.load import generation_defaults, load_model, model_folder, served_context

log = logging.getLogger(__name__)
CPU_PREFILL_CHUNK = 256  # a 2-core CPU: a chunk is ~0.1 s, so the streams running wait little
GPU_PREFILL_CHUNK = 2048  # a GPU: a few hundred tokens leave it idle; vLLM's chunks are 2-8k


def prefill_chunk(configured: int | None, on_gpu: bool) -> int:
    """engine.prefill_chunk, else by device."""
    return configured or (GPU_PREFILL_CHUNK if on_gpu else CPU_PREFILL_CHUNK)


def prefix_cache_budget(configured_mb: int | None, model: Any) -> int:
    """The prefix cache's budget in bytes: the configured MiB (on a GPU the memory budget's, set at
    start), else 1 GiB."""
    return 1024 << 20 if configured_mb is None else configured_mb << 20


def kv_tokens(batch_kv_mb: int | None, model: Any) -> int | None:
    """How many KV positions (every layer's keys and values, in the model's dtype) `batch_kv_mb`
    holds; None: no bound."""
    if batch_kv_mb is None:
        return None
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()
    return (batch_kv_mb << 20) // per_token


def build_local_engine(config: Config) -> tuple[LocalEngine, Any]:
    """The local engine and the tokenizer the gateway renders prompts with."""
    e, m, t = config.engine, config.model, config.train
    if e.threads:
        torch.set_num_threads(e.threads)
    folder = model_folder(m.path, config.cache_dir())
    context = served_context(m.path, m.max_context)
    gpu = cuda_index(m.device, torch.cuda.is_available())
    if gpu is not None:
        cap_process(f"cuda:{gpu}", e.gpu_share)  # before the weights: all this process holds counts
    loaded = load_model(
        path=folder,
        device=m.device,
        dtype=m.dtype,
        max_context=context,
        rope_scaling=m.rope_scaling,
        scale_rope=m.scale_rope,
    )
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
        prefill_chunk=prefill_chunk(e.prefill_chunk, gpu is not None),
        prefix_cache=cache,
        lora_targets=t.lora.targets,
        merge_eagerly=config.collect.enabled
        and t.enabled
        and t.weights == "lora"
        and not config.per_user_adapters,
        sampling_defaults=generation_defaults(folder, config.model.repetition_guard),
        constrained_decoding=e.constrained_decoding,
        kv_tokens=kv_tokens(e.batch_kv_mb, loaded.model),
        per_user=config.per_user_adapters,
        adapter_slots=local_slots(config),
        lora_rank=t.lora.rank,
    )
    return engine, loaded.tokenizer
