"""A running decode batch: sequences that share one left-padded KV cache.

Continuous batching on a plain Hugging Face causal LM. Row i of the cache holds
`pad_i` padding positions and then its `lengths[i]` real positions; `mask` [B, L]
is 1 on real positions. New sequences are prefilled together (left-padded), then
join (both sides left-padded to one width); finished rows leave by index selection,
and columns that became padding for every row are trimmed. Joining and leaving
copy the cache; a decoding step only appends one column.

Only caches whose layers keep `keys`/`values` tensors [B, heads, L, head_dim]
(full-attention `DynamicLayer`s) are supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _left_pad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Pad `n` zeros at the start of dimension `dim`."""
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class DecodeBatch:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, L], int64
        self.lengths: list[int] = []  # real positions per row

    def __len__(self) -> int:
        return len(self.lengths)

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """Run prompts together, left-padded. Returns last-position logits [n, V], their cache and mask."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1], out.past_key_values, mask

    @torch.inference_mode()
    def extend(
        self, cache: DynamicCache | None, ids: list[int], past: int
    ) -> tuple[torch.Tensor, DynamicCache]:
        """Prefill the next chunk of one long prompt into its own cache; returns the last logits [V]."""
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        x = torch.tensor([ids], device=self.device)
        positions = torch.arange(past, past + len(ids), device=self.device)[None]
        out = self.model(
            input_ids=x, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[0, -1], out.past_key_values

    def join(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append prefilled rows (their cache and [n, L] mask) at the end of the batch."""
        lengths = mask.sum(-1).tolist()
        if self.cache is None or self.mask is None:
            self.cache, self.mask, self.lengths = cache, mask, lengths
            return
        width = self.mask.shape[1]
        grow, pad = max(0, mask.shape[1] - width), max(0, width - mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, grow, 2), _left_pad(theirs.keys, pad, 2)], 0)
            mine.values = torch.cat([_left_pad(mine.values, grow, 2), _left_pad(theirs.values, pad, 2)], 0)
        self.mask = torch.cat([_left_pad(self.mask, grow, 1), _left_pad(mask, pad, 1)], 0)
        self.lengths += lengths

    def keep(self, rows: list[int]) -> None:
        """Keep only the given rows, in that order; trim all-padding columns."""
        if not rows:
            self.cache, self.mask, self.lengths = None, None, []
            return
        if rows == list(range(len(self))):
            return
        assert self.cache is not None and self.mask is not None
        index = torch.tensor(rows, device=self.device)
        self.lengths = [self.lengths[r] for r in rows]
        start = self.mask.shape[1] - max(self.lengths)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
        self.mask = self.mask.index_select(0, index)[:, start:]

    def take(self, rows: list[int]) -> tuple[DynamicCache, torch.Tensor]:
        """Lift rows out of the batch (to park them); returns their cache and mask, trimmed."""
        assert self.cache is not None and self.mask is not None
        index = torch.tensor(rows, device=self.device)
        mask = self.mask.index_select(0, index)
        start = int((mask.sum(0) == 0).long().cumprod(0).sum())  # leading all-padding columns
        kv = [
            (mine.keys.index_select(0, index)[:, :, start:], mine.values.index_select(0, index)[:, :, start:])
            for mine in self.cache.layers
        ]
        self.keep([r for r in range(len(self)) if r not in set(rows)])
        return self.cache_of(kv), mask[:, start:]

    def cache_of(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
        """A cache holding these keys and values per layer (not copied: a cache grows by concatenation)."""
        cache = DynamicCache(config=self.model.config)
        for layer, (keys, values) in zip(cache.layers, kv, strict=True):
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        return cache

    @torch.inference_mode()
    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row; return next-token logits [B, V]."""
        assert self.cache is not None and self.mask is not None and len(tokens) == len(self)
        ids = torch.tensor(tokens, device=self.device)[:, None]
        positions = torch.tensor(self.lengths, device=self.device)[:, None]
        self.mask = F.pad(self.mask, (0, 1), value=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.lengths = [n + 1 for n in self.lengths]
        return out.logits[:, -1]
