"""A prompt prefix that several rows share, computed once: one row of the prefix and each row's
remainder, under a block attention mask with restarted positions.

Every OpenClaw turn starts with the agent's ~2,300-token system prompt; four such turns scored
as four rows run it four times in each pass (the policy's, the reference's, the teacher's).
`share_prefixes` merges rows of a `Layout` (train/packing.py) whose prompts start alike into one
row: the longest prefix P they all share, then each row's remainder (the rest of its prompt and
its response span) one after the other:

    row:       [ P (shared) | tail_1 + answer_1 | tail_2 + answer_2 | ... ]
    positions:   0 .. P-1     P .. P+n_1-1        P .. P+n_2-1            (restarted per block)
    attends:     causal       P and block 1       P and block 2           (`block_attention`)

Under that mask and those positions each block sees exactly the keys and rotary phases it saw as
its own row, so every logit, and through autograd every gradient, is the unshared one: the
prefix's hidden states get the sum of the blocks' gradients, as they would if the rows had each
computed it. The trap avoided: positions left running on (P + n_1 + ...) change RoPE's phases
and the logits with them, and a block that sees another block leaks one turn into the next.

The merged row's response is the blocks one after the other; samples keep their `offsets` into
it, so `loss_positions` and `unpack` read it as they read a session's row. The micro-batch budget
counts what a row adds past the shared prefix: rows merge while their remainders together stay
within it (`budget`), so a pass's tokens are at most the prefix plus the budget. Rows merge only
when they are scored alike (temperature, an explicit RoPE choice, no grammar) and share at least
`MIN_SHARED` tokens: below that the dense mask costs more than the tokens it saves. The mask
needs an attention that takes a 4D mask (`sdpa` or `eager`), not flash-attention's varlen.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clawrl.train.batch import Padded
from clawrl.train.packing import Layout
from clawrl.types import Sample

MIN_SHARED = 64  # tokens; a shorter common prefix is not worth a dense [L, L] mask
MASKED_ATTENTION = ("sdpa", "eager")  # the attentions that take a 4D mask as it is


def share_prefixes(
    layout: Layout, samples: Sequence[Sample], budget: int, min_shared: int = MIN_SHARED
) -> Layout:
    """`layout`'s rows, those sharing a prompt prefix merged (see the module's doc)."""
    groups: dict[tuple, list[int]] = {}
    for r, members in enumerate(layout.members):
        first, prompt = samples[members[0]], layout.prompts[r]
        alike = len(prompt) >= min_shared and not first.grammar and first.rope_scaled is not None
        key = (tuple(prompt[:min_shared]), first.temperature, first.rope_scaled) if alike else (r,)
        groups.setdefault(key, []).append(r)
    out = Layout(row_of=[0] * len(samples), offsets=[0] * len(samples))
    for rows in groups.values():
        for chunk in _chunks(layout, rows, budget):
            _merge(out, layout, chunk)
    return out


def one_a_row(prompts: Sequence[list[int]], responses: Sequence[list[int]]) -> Layout:
    """The layout of sequences scored one a row (a teacher pass's hinted prompts)."""
    n = len(prompts)
    rows = [list(r) for r in responses]
    return Layout(
        prompts=list(prompts),
        responses=rows,
        members=[[i] for i in range(n)],
        row_of=list(range(n)),
        offsets=[0] * n,
    )


def _chunks(layout: Layout, rows: list[int], budget: int) -> list[list[int]]:
    """`rows` in order, cut where the remainders past their common prefix would pass `budget`."""
    out: list[list[int]] = []
    for r in rows:
        if out:
            chunk = out[-1]
            shared = _common(layout.prompts[chunk[0]], layout.prompts[r], _shared(layout, chunk))
            if sum(_length(layout, c) - shared for c in [*chunk, r]) <= budget:
                chunk.append(r)
                continue
        out.append([r])
    return out


def _length(layout: Layout, r: int) -> int:
    return len(layout.prompts[r]) + len(layout.responses[r])


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """The length of the common prefix of `a` and `b`, at most `limit`."""
    n = min(len(a), len(b), limit)
    return next((i for i in range(n) if a[i] != b[i]), n)


def _shared(layout: Layout, rows: list[int]) -> int:
    first = layout.prompts[rows[0]]
    n = len(first)
    for r in rows[1:]:
        n = _common(first, layout.prompts[r], n)
    return n


def _merge(out: Layout, layout: Layout, rows: list[int]) -> None:
    """Append `rows` to `out` as one row (as it is, if alone), moving their samples' offsets."""
    new = len(out.members)
    shared = _shared(layout, rows) if len(rows) > 1 else len(layout.prompts[rows[0]])
    response: list[int] = []
    starts: list[int] = []
    members: list[int] = []
    for r in rows:
        starts.append(len(response))
        base = len(response) + len(layout.prompts[r]) - shared  # where row r's response begins
        response += layout.prompts[r][shared:] + layout.responses[r]
        for i in layout.members[r]:
            out.row_of[i], out.offsets[i] = new, base + layout.offsets[i]
        members += layout.members[r]
    out.prompts.append(layout.prompts[rows[0]][:shared])
    out.responses.append(response)
    out.members.append(members)
    out.starts.append(starts if len(rows) > 1 else [])


def block_attention(batch: Padded, layout: Layout, additive: bool = False) -> None:
    """Give `batch` (left-padded from `layout`'s rows) its blocks' positions and 4D mask
    [B, 1, L, L] where a row has blocks; a batch without any is left as it is. The mask is
    boolean (True: attend) for sdpa, additive (0 or the float minimum) with `additive`, as eager
    attention adds it to its scores."""
    if not any(layout.starts):
        return
    width = batch.input_ids.shape[1]
    block = torch.full((len(layout.members), width), -1, dtype=torch.long)  # -1: padding, 0: prefix
    positions = batch.position_ids.clone().cpu()
    for r, starts in enumerate(layout.starts):
        prompt, response = len(layout.prompts[r]), len(layout.responses[r])
        pad = width - prompt - response
        block[r, pad:] = 0
        if not starts:  # a row alone (no blocks) is all prefix: causal, its positions as they are
            continue
        for k, (a, b) in enumerate(zip(starts, [*starts[1:], response], strict=True)):
            block[r, pad + prompt + a : pad + prompt + b] = k + 1
            positions[r, pad + prompt + a : pad + prompt + b] = torch.arange(prompt, prompt + b - a)
    query, key = block[:, :, None], block[:, None, :]
    allowed = ((key == 0) | (key == query)) & (key >= 0) & torch.ones(width, width, dtype=torch.bool).tril()
    allowed |= torch.eye(width, dtype=torch.bool)  # a padding query sees itself: no empty softmax row
    mask = allowed[:, None]
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    batch.blocks = mask.to(batch.input_ids.device)
    batch.position_ids = positions.to(batch.input_ids.device)


def attention_of(model: torch.nn.Module) -> str | None:
    """The attention implementation `model` (or the model a DDP or PEFT wrapper holds) runs."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None)
