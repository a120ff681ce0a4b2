"""A long prompt's KV and the prefix cache (`prefix_cache.py`): where its prefill starts, what it keeps.

Before a long prompt's first chunk its KV starts from the longest cached prefix (`start_from_cache`);
after its last chunk it is kept for later requests (`keep_prefix`). Entries are salted by version: a
prompt starts from another version's KV only with `across_versions`, and then records which
(`Request.cached_version`, recorded with its turn); a prompt during whose prefill a swap came is not
kept (its KV would mix two versions). Scaled and unscaled RoPE never match each other, nor do two
users' prompts (`SamplingParams.adapter`: the request's user; see prefix_cache.py).
"""

from __future__ import annotations

from clawrl.engine.local.batch import DecodeBatch
from clawrl.engine.local.prefix_cache import PrefixCache
from clawrl.engine.local.schedule import Request


def start_from_cache(cache: PrefixCache | None, batch: DecodeBatch, req: Request, version: str) -> None:
    """Start `req`'s KV from the longest cached prefix of its prompt (`version`: its user's now)."""
    req.kv_version = version
    if cache is None:
        return
    hit, kv = cache.lookup(req.prompt_ids, version, rope_key(req), req.params.adapter)
    if kv is not None:
        req.cache, req.prefilled, req.cached_tokens = batch.cache_of(kv), hit, hit
        older = cache.last_hit_version
        req.cached_version = older if older != version else None


def keep_prefix(cache: PrefixCache | None, req: Request, version: str) -> None:
    """Keep `req`'s prefilled KV, salted by the oldest version that computed part of it; nothing if a
    swap came during its prefill (`version`, its user's now, is not the one it started under)."""
    if cache is None or req.kv_version != version:
        return
    kv = [(layer.keys, layer.values) for layer in req.cache.layers]
    cache.insert(
        ids=req.prompt_ids,
        kv=kv,
        version=req.cached_version or version,
        rope=rope_key(req),
        user=req.params.adapter,
    )


def rope_key(req: Request) -> str:
    """The prefix cache keeps scaled and unscaled KV apart: they never match each other."""
    return "scaled" if req.scaled else "own"
