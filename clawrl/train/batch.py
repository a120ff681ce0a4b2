"""Micro-batches: a step's samples packed under a token budget, and scored together.

A training step may hold samples of very different lengths. `pack` groups
them, in order, so that each group's padded size (rows x longest sequence)
stays within `train.micro_batch_tokens`; a sample longer than the budget goes
alone. Memory per forward/backward pass is then bounded by the budget, not by
the step's batch size.

`score` runs one group through a causal LM, left-padded (the engine's
layout: position ids count real tokens only), and keeps the logits of the
last `R_max + 1` positions, since only response tokens are scored:

    row i:  [pad ... pad | prompt_i | response_i]      response_i has R_i tokens
    logits kept: [B, R_max + 1, V] -> row i's response predictions are its last R_i positions
                                      before the final one

With `Padded.scored` (the trainer's batches: the positions the loss reads, a packed row's answers
and not the messages between them), the LM head sees only those N positions' hidden states and
the logits are [1, N, V]: a 30,000-token session with 640 answer tokens at Qwen3's 151,936-row
vocabulary keeps 0.2 GB of bf16 logits, not 9 GB. The same numbers come out at those positions.

It returns per-token logprobs and entropies *left-aligned* ([B, R_max], row i
valid on its first R_i entries, like a right-padded batch), which is the
layout of `policy_loss` and `batch_advantages`.

A row decoded under a grammar (`Padded.grammar`, from `Sample.grammar`) is scored
under the same mask: the grammar is replayed over its response tokens
(`clawrl/model/constrain.py: response_masks`), right-aligned like the targets, so
whatever the left padding or packing, position j of row i is masked by the
allowed set its response token was drawn from. Rows without one are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from clawrl.model.constrain import response_masks
from clawrl.model.rope import rope_rows
from clawrl.train.logprobs import chunked_token_logprobs, chunked_topk


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of `lengths` grouped in order so that len(group) * max(length) <= budget (or one alone)."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if current and (len(current) + 1) * wider > budget:
            groups.append(current)
            current, wider = [], n
        current.append(i)
        longest = wider
    if current:
        groups.append(current)
    return groups


def halves(groups: list[list[int]]) -> list[list[int]]:
    """Each group split in two, in order (a group of one stays): a step retried after running out
    of memory (clawrl/train/failures.py) makes twice the passes at about half the activations."""
    return [h for g in groups for h in ((g[: len(g) // 2], g[len(g) // 2 :]) if len(g) > 1 else (g,))]


def even_out(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` split until there are `count` of them, where they can be: the group with the most
    members is halved (in order) each time; a list of single members stays as it is. Ranks in
    lockstep (FSDP) then make the same number of passes, each with samples of its own, where
    otherwise a rank short of micro-batches passes one again at zero weight."""
    out = [list(g) for g in groups]
    while len(out) < count:
        widest = max(range(len(out)), key=lambda i: len(out[i]))
        if len(out[widest]) < 2:
            break
        g = out[widest]
        out[widest : widest + 1] = [g[: len(g) // 2], g[len(g) // 2 :]]
    return out


@dataclass
class Padded:
    """A left-padded batch of prompt + response sequences."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    position_ids: Tensor  # [B, L]
    targets: Tensor  # [B, R_max] response ids, right-aligned (row i's last R_i entries), else 0
    lengths: list[int]  # R_i
    # Per row, the RoPE it was served with (clawrl/model/rope.py); None (a row or all): by length.
    rope: Sequence[bool | None] | None = None
    # Per row, the grammar it was decoded under (clawrl/chat/grammar.py); None (a row or all): none.
    grammar: Sequence[dict | None] | None = None
    masks: Tensor | None = None  # the grammars' masks, once `grammar_masks` built them
    # [B, R_max] bool, right-aligned as the targets: the positions the loss reads (a packed row's
    # answers, not the messages between them: train/packing.py); None: every response position.
    scored: Tensor | None = None
    # [B, 1, L, L]: the 4D attention mask of rows that share a prompt prefix (train/sharing.py),
    # used instead of `attention_mask`; None: every row is one causal sequence.
    blocks: Tensor | None = None
    # [B, R_max, K] token ids, right-aligned as the targets, scored beside them with their graph (a
    # teacher's likeliest tokens: train/topk.py); None: the targets alone.
    extra: Tensor | None = None


def left_pad(prompts: Sequence[list[int]], responses: Sequence[list[int]], device: torch.device) -> Padded:
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    r_max = max(len(r) for r in responses)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    targets = torch.tensor([[0] * (r_max - len(r)) + r for r in responses], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return Padded(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        targets=targets,
        lengths=[len(r) for r in responses],
    )


@dataclass
class Scores:
    """What `score_with` returns, every tensor left-aligned ([B, R_max, ...], row i valid on its first
    R_i entries)."""

    logp: Tensor  # [B, R_max] the targets' log-probs, with a graph unless under no_grad
    entropy: Tensor | None  # [B, R_max], or None without `with_entropy`
    top_ids: Tensor | None = None  # [B, R_max, K] the K likeliest tokens at each position (`topk`)
    top_logp: Tensor | None = None  # [B, R_max, K] their log-probs, without gradient
    extra_logp: Tensor | None = None  # [B, R_max, K] the log-probs of `batch.extra`'s ids, with a graph


def score(
    model: nn.Module,
    batch: Padded,
    temperatures: Tensor,
    with_entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(logp [B, R_max], entropy [B, R_max] or None), left-aligned; with a graph unless under no_grad.

    The entropy carries a gradient only with `entropy_grad` (an entropy bonus); otherwise it is
    a detached metric. Log-probs are taken a few positions at a time (`train/logprobs.py`), so no
    full-vocabulary log-softmax copy of the logits is ever made.
    """
    out = score_with(model, batch, temperatures, with_entropy=with_entropy, entropy_grad=entropy_grad)
    return out.logp, out.entropy


def score_with(
    model: nn.Module,
    batch: Padded,
    temperatures: Tensor,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    topk: int = 0,
) -> Scores:
    """`score`, and from the same logits: the `topk` likeliest tokens at each response position (a
    teacher's, train/topk.py), and the log-probs of `batch.extra`'s ids (the student's, with the
    targets' graph) when it has them."""
    r_max = batch.targets.shape[1]
    allowed = grammar_masks(model, batch)
    keep = batch.scored
    targets = batch.targets if batch.extra is None else torch.cat([batch.targets[..., None], batch.extra], -1)
    if keep is None:
        logits = response_logits(model, batch)
        temps = temperatures
    else:
        logits = scored_logits(model, batch, keep)  # [1, N, V]
        temps = torch.as_tensor(temperatures, device=logits.device)
        temps = temps.reshape(-1, 1).expand(keep.shape)[keep][None] if temps.dim() else temps  # [1, N]
        targets, allowed = targets[keep][None], (allowed[keep][None] if allowed is not None else None)
    logp, entropy = chunked_token_logprobs(
        logits=logits, targets=targets, temperature=temps, with_entropy=with_entropy, allowed=allowed
    )
    top = chunked_topk(logits, temps, topk, positions=targets.shape[1], allowed=allowed) if topk else None
    del logits
    if keep is not None:  # back to [B, R_max, ...]; 0 elsewhere (never read: the loss masks it)
        logp, entropy = _unscored(logp, keep), _unscored(entropy, keep)
        top = tuple(_unscored(x, keep) for x in top) if top is not None else None
    if not entropy_grad:
        entropy = entropy.detach()
    align = _left_align_index(batch.lengths, r_max, logp.device)
    extra = None
    if batch.extra is not None:
        logp, extra = logp[..., 0], _aligned(logp[..., 1:], align)
    return Scores(
        logp=logp.gather(1, align),
        entropy=entropy.gather(1, align) if with_entropy else None,
        top_ids=_aligned(top[0], align) if top is not None else None,
        top_logp=_aligned(top[1], align) if top is not None else None,
        extra_logp=extra,
    )


def _unscored(x: Tensor, keep: Tensor) -> Tensor:
    """[B, R_max, ...] from the [1, N, ...] values at `keep`'s N positions, zeros elsewhere."""
    out = x.new_zeros((*keep.shape, *x.shape[2:]))
    out[keep] = x[0]
    return out


def _aligned(x: Tensor, align: Tensor) -> Tensor:
    """[B, R_max, K] right-aligned -> left-aligned by `_left_align_index`'s positions."""
    return x.gather(1, align[..., None].expand(-1, -1, x.shape[-1]))


def grammar_masks(model: nn.Module, batch: Padded) -> Tensor | None:
    """[B, R_max, W] int32 bitmask words of the rows' grammars, right-aligned as the targets; None
    when no row has one (on the targets' device)."""
    if not batch.grammar or not any(batch.grammar):
        return None
    if batch.masks is None:  # built once: the reference and the policy score the same batch
        r_max = batch.targets.shape[1]
        rows = zip(batch.targets.tolist(), batch.lengths, strict=True)
        masks = response_masks(model, list(batch.grammar), [row[r_max - n :] for row, n in rows], r_max)
        batch.masks = masks.to(batch.targets.device) if masks is not None else None
    return batch.masks


def response_logits(model: nn.Module, batch: Padded) -> Tensor:
    """logits [B, R_max + 1, V] of the last R_max + 1 positions: position j predicts the token after
    it, so the first R_max predict the (right-aligned) response tokens; the last predicts nothing."""
    with rope_rows(model, batch.rope):  # per row: scaled, the model's own, or None: by its length
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask if batch.blocks is None else batch.blocks,
            position_ids=batch.position_ids,
            logits_to_keep=batch.targets.shape[1] + 1,
            use_cache=False,  # whole sequences are scored: no KV cache to keep
        )
    return out.logits


def scored_logits(model: nn.Module, batch: Padded, keep: Tensor) -> Tensor:
    """logits [1, N, V] at the N True entries of `keep` [B, R_max] (row-major), entry (i, j) the
    prediction of target (i, j). The whole forward runs (the root's hooks, FSDP's included, a
    softcap after the head), but a pre-hook on the LM head hands it only those positions' hidden
    states: a packed session's head output and its gradient are its answers' size, not its own."""
    r_max = batch.targets.shape[1]

    def gather(_module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]  # [B, R_max + 1, H]: the kept positions; the last predicts nothing
        return (hidden[:, :r_max][keep][None], *args[1:])

    head = getattr(model, "module", model).get_output_embeddings()  # DDP keeps the model in .module
    handle = head.register_forward_pre_hook(gather)
    try:
        return response_logits(model, batch)
    finally:
        handle.remove()


def _left_align_index(lengths: list[int], r_max: int, device: torch.device) -> Tensor:
    """For row i, entry t reads right-aligned position (R_max - R_i) + t (clamped past the end)."""
    shift = torch.tensor([r_max - n for n in lengths], device=device)[:, None]
    return (torch.arange(r_max, device=device)[None] + shift).clamp(max=r_max - 1)


def pad_rows(rows: Sequence[Sequence[float]], width: int, device: torch.device, fill: float = 0.0) -> Tensor:
    """Right-pad float rows to [B, width]."""
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], device=device)
