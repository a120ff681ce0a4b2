"""Prefix caching: the KV cache of recent prompts, reused when a new prompt starts the same way.

An agent resends its whole history every turn: OpenClaw's system prompt and tool list alone are
thousands of tokens, byte-identical from turn to turn. The engine keeps the KV cache of each long
prompt it prefilled (`insert`) and, for a new prompt, finds the cached prompt sharing the longest
common token prefix with it (`lookup`); only the rest is prefilled.

- Entries hold one sequence's keys and values per layer, [1, kv_heads, length, head_dim], exactly
  as a standalone prefill computed them (positions 0..length-1). A hit hands out views of the first
  `n` positions; the engine's cache grows by concatenation, so an entry is never written to.
- Matching is exact, token by token (no block rounding), and always leaves at least one prompt token
  to prefill: the engine needs the last position's logits to sample the first token.
- Memory is bounded by `budget_bytes`: least recently used entries are evicted first; an entry
  larger than the whole budget is simply not kept (never an error). An entry whose tokens are a
  prefix of a newer entry's is dropped when the newer one is inserted: a conversation keeps one.
- Entries are keyed by the RoPE their KV was computed with (scaled or the model's own): the two
  never match, whatever `across_versions` says.
- Entries belong to the user whose request computed them (`SamplingParams.adapter`, the API key's
  user, docs/users.md) and match only that user's lookups, whatever the version: a hit, and the
  `cached_tokens` it reports, would otherwise tell a user, to the token, how much of their prompt
  another user sent recently (a side channel over other users' prompts), and with an adapter per
  user the KV of another user's adapter is not this user's model. Users who send the same system
  prompt each prefill it once. `drop_user` forgets a user's entries (their data erased).
- Entries are salted by the policy version whose weights computed them (the oldest, where a prompt
  started from an older entry). With `across_versions` (`engine.prefix_cache_across_versions`, the
  default) a lookup matches entries of every version, so an agent's long prompt is not prefilled
  again after each weight swap: the new version's tokens then attend to KV an older version
  computed. `last_hit_version` names the version of the entry a lookup used; the engine records it
  on the turn when it is not the version serving, and the trainer's truncated importance weight
  corrects for it (the behaviour logprob is what was sampled, the trainer recomputes the whole
  sequence with its own weights). Without `across_versions` a lookup only matches the version
  being served, and the engine clears the cache on a swap.

Not thread-safe: the engine touches it from its one worker thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from clawrl.types import DEFAULT_USER

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, length, head_dim]


@dataclass(eq=False)
class _Entry:
    ids: torch.Tensor  # [length] int64
    kv: KV
    version: str
    nbytes: int
    rope: str = ""  # which rotary table computed it ("scaled" / "own"; see clawrl/model/rope.py)
    user: str = DEFAULT_USER  # whose request computed it: only their lookups match it


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0  # prompt tokens served from the cache
    looked_up_tokens: int = 0  # prompt tokens of every lookup
    inserted: int = 0
    evicted: int = 0
    entries: int = 0
    bytes: int = 0
    budget_bytes: int = 0
    cleared: int = 0


class PrefixCache:
    def __init__(self, budget_bytes: int, across_versions: bool = False) -> None:
        self.budget = budget_bytes
        self.across_versions = across_versions
        self.last_hit_version: str | None = None  # the version of the entry the last lookup used
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self._bytes = 0
        self.stats = PrefixCacheStats(budget_bytes=budget_bytes)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def lookup(
        self, ids: list[int], version: str, rope: str = "", user: str = DEFAULT_USER
    ) -> tuple[int, KV | None]:
        """The longest prefix of `ids` (at most len(ids) - 1 tokens) among `user`'s entries, and its KV
        views; of two as long, the one `version` computed."""
        self.stats.lookups += 1
        self.stats.looked_up_tokens += len(ids)
        self.last_hit_version = None
        query = torch.tensor(ids, dtype=torch.long)
        best, best_len, best_own = None, 0, False
        for key, entry in self._entries.items():
            if entry.user != user:
                continue  # another user's prompt: never reused, never counted (module docstring)
            if entry.rope != rope or (entry.version != version and not self.across_versions):
                continue  # KV computed with another RoPE never matches (clawrl/model/rope.py)
            n, own = _common_prefix(entry.ids, query), entry.version == version
            if (n, own) > (best_len, best_own):
                best, best_len, best_own = key, n, own
        best_len = min(best_len, len(ids) - 1)
        if best is None or best_len <= 0:
            return 0, None
        self.last_hit_version = self._entries[best].version
        self._entries.move_to_end(best)
        self.stats.hits += 1
        self.stats.hit_tokens += best_len
        kv = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in self._entries[best].kv]
        return best_len, kv

    def insert(self, ids: list[int], kv: KV, version: str, rope: str = "", user: str = DEFAULT_USER) -> bool:
        """Keep the KV of `user`'s prompt `ids`; returns False when it cannot fit the budget at all."""
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.budget or not ids:
            return False
        query = torch.tensor(ids, dtype=torch.long)
        same = [k for k, e in self._entries.items() if (e.version == version or self.across_versions)]
        for key in [k for k in same if self._entries[k].rope == rope and self._entries[k].user == user]:
            entry = self._entries[key]
            if len(entry.ids) <= len(ids) and _common_prefix(entry.ids, query) == len(entry.ids):
                self._remove(key)  # the new entry holds all of it
        self._entries[self._next] = _Entry(
            ids=query, kv=kv, version=version, nbytes=nbytes, rope=rope, user=user
        )
        self._next += 1
        self._bytes += nbytes
        self.stats.inserted += 1
        while self._bytes > self.budget:
            self._remove(next(iter(self._entries)))
            self.stats.evicted += 1
        self._sync()
        return True

    def clear(self) -> None:
        """Drop every entry (after a weight swap)."""
        if self._entries:
            self.stats.cleared += 1
        self._entries.clear()
        self._bytes = 0
        self._sync()

    def drop_user(self, user: str) -> int:
        """Forget every entry of `user`'s (their data was erased); how many there were."""
        mine = [k for k, e in self._entries.items() if e.user == user]
        for key in mine:
            self._remove(key)
        return len(mine)

    def _remove(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes
        self._sync()

    def _sync(self) -> None:
        self.stats.entries = len(self._entries)
        self.stats.bytes = self._bytes


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens two id tensors share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n
