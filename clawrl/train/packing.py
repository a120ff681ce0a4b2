"""A session's turns scored in one sequence: samples whose prompt continues another's whole sequence.

An agent resends its whole history every turn, so turn k+1's prompt is turn k's prompt and
answer and then the new message (OpenClaw's turns match token for token). Scoring each turn's
sample alone recomputes the shared prefix once per turn: a 3-turn OpenClaw session of ~2,500-
token prompts costs ~7,600 tokens per pass where one sequence of ~2,600 holds them all. Under a
causal model the logits at turn k's answer positions do not depend on what follows, so scoring
turn k+1's sequence once gives turn k's answer logprobs too, exactly.

`pack_prefixes` groups a micro-batch's samples into rows: a sample joins a row when the row's
whole sequence so far (its first prompt, then everything up to the last answer it holds) is a
prefix of the sample's prompt, they share a temperature and a RoPE choice, and neither was decoded
under a grammar (whose masks are replayed per response). The row's "response" is then everything
from its first answer's first token to its last answer's last: the messages between answers are
in it, not scored (`loss_positions`) and masked out by the loss. `unpack` takes a row-major
tensor [R, L] (what `score` returns for the rows, left-aligned) back to the samples' layout
[S, T] (sample i's tokens first), by indexing, so gradients flow; everything after the scoring
(advantages, importance weights, the loss) is per sample, unchanged. `loss_positions` marks
the rows' answer tokens, the positions the loss reads: the LM head runs there only
(train/batch.py: `Padded.scored`), so a 30,000-token session with short answers makes logits for
its answers, not for the whole session. The teacher pass of an opd sample is its own sequence
(the hint sits inside its prompt) and is not packed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from clawrl.types import Sample


@dataclass
class Layout:
    """Rows of samples: row r is `prompts[r] + responses[r]`; sample i's response starts at
    `offsets[i]` in the response of row `row_of[i]`."""

    prompts: list[list[int]] = field(default_factory=list)
    responses: list[list[int]] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)  # per row, its samples in order
    row_of: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    # Per row, where each block of a shared prefix's row starts in its response (train/sharing.py);
    # empty (or no entry): the row is one causal sequence.
    starts: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens one pass over the rows scores."""
        return sum(len(p) + len(r) for p, r in zip(self.prompts, self.responses, strict=True))


def _packable(a: Sample, b: Sample) -> bool:
    return a.temperature == b.temperature and a.rope_scaled == b.rope_scaled and not (a.grammar or b.grammar)


def pack_prefixes(samples: Sequence[Sample], enabled: bool = True) -> Layout:
    """The rows of `samples` (one each when not `enabled`); see the module's doc."""
    out = Layout(row_of=[0] * len(samples), offsets=[0] * len(samples))
    order = (
        sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids))
        if enabled
        else range(len(samples))
    )
    for i in order:
        s = samples[i]
        row = next((r for r in range(len(out.members)) if enabled and _continues(out, r, samples, s)), None)
        if row is None:
            out.prompts.append(list(s.prompt_ids))
            out.responses.append(list(s.response_ids))
            out.members.append([i])
            out.row_of[i], out.offsets[i] = len(out.members) - 1, 0
            continue
        response = out.responses[row]
        between = s.prompt_ids[len(out.prompts[row]) + len(response) :]
        out.row_of[i], out.offsets[i] = row, len(response) + len(between)
        response += between + list(s.response_ids)
        out.members[row].append(i)
    return out


def _continues(out: Layout, row: int, samples: Sequence[Sample], s: Sample) -> bool:
    """Whether `s`'s prompt starts with row `row`'s whole sequence (and they may share a row)."""
    if not _packable(samples[out.members[row][0]], s):
        return False
    prompt, response = out.prompts[row], out.responses[row]
    n = len(prompt) + len(response)
    return (
        len(s.prompt_ids) >= n
        and s.prompt_ids[: len(prompt)] == prompt
        and s.prompt_ids[len(prompt) : n] == response
    )


def loss_positions(layout: Layout, lengths: Sequence[int], device: torch.device) -> Tensor:
    """[R, R_max] bool, right-aligned as `batch.left_pad`'s targets: True where a row's response
    holds one of its samples' answers (`lengths[i]` tokens at `offsets[i]`); the messages between
    a row's answers and the left padding are False."""
    r_max = max(len(r) for r in layout.responses)
    out = torch.zeros(len(layout.responses), r_max, dtype=torch.bool)
    for _, row, span in _answer_spans(layout, lengths, r_max):
        out[row, span] = True
    return out.to(device)


def _answer_spans(layout: Layout, lengths: Sequence[int], r_max: int) -> Iterator[tuple[int, int, slice]]:
    """(sample, row, positions) of each sample's answer in its row, right-aligned to `r_max` as
    `batch.left_pad`'s targets (`lengths[i]` tokens at `offsets[i]` of the row's response)."""
    for i, n in enumerate(lengths):
        row = layout.row_of[i]
        start = r_max - len(layout.responses[row]) + layout.offsets[i]
        yield i, row, slice(start, start + n)


def unpack(rows: Tensor, layout: Layout, width: int) -> Tensor:
    """[S, width] from row-major [R, L] (left-aligned): sample i's entries t = rows[row_i, offset_i + t],
    clamped to the row's last entry past it (those entries are masked, as padding is)."""
    device = rows.device
    row = torch.tensor(layout.row_of, device=device)
    start = torch.tensor(layout.offsets, device=device)
    cols = (start[:, None] + torch.arange(width, device=device)[None]).clamp(max=rows.shape[1] - 1)
    return rows[row[:, None], cols]


def to_targets(values: Tensor, layout: Layout, lengths: Sequence[int], r_max: int) -> Tensor:
    """[R, r_max, ...] right-aligned as `batch.left_pad`'s targets, from the samples' [S, T, ...]
    (sample i's first `lengths[i]` entries): `unpack`'s inverse, for what a pass scores beside the
    targets (a teacher's likeliest tokens: train/topk.py). Zeros where no sample's answer is."""
    out = values.new_zeros(len(layout.responses), r_max, *values.shape[2:])
    for i, row, span in _answer_spans(layout, lengths, r_max):
        out[row, span] = values[i, : lengths[i]]
    return out
