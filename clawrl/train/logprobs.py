"""Chosen tokens' log-probs and entropies from full-vocabulary logits, a few positions at a time.

The same numbers as `loss.token_logprobs` (log softmax(logits / T) at the
target, and the entropy of that distribution), without its full-size copies.
`token_logprobs` keeps, per micro-batch of P scored positions and a vocabulary
of V (49,152 for SmolLM2), several [P, V] float32 tensors alive at once: the
scaled logits, the log-softmax (saved for backward), its exp and their
product (saved for the entropy's backward), then their gradients. At the
default 2,048-token micro-batch one such tensor is 400 MB.

Here, the forward pass walks the positions in chunks of about `CHUNK_ELEMENTS`
logits and keeps only, per position, the log-normaliser `lse` and the
entropy `H`. The backward pass recomputes each chunk's softmax and writes the
gradient straight into one [B, L, V] tensor (the one the LM head's backward
needs anyway). With z = logits / T, p = softmax(z), log p = z - lse:

    d logp_t / d z_j = 1[j = t] - p_j
    d H      / d z_j = -p_j (log p_j + H)
    d        / d logits = (d / d z) / T

`chunked_token_logprobs(logits, targets, T)` scores the first `targets.shape[1]`
positions of `logits` [B, L, V] (the model's kept logits, with the position
after the last target left out), so no sliced copy of the logits is made.

Grammars. A sample decoded under a grammar (`Sample.grammar`) was sampled from
the distribution masked to the tokens the grammar allowed at each position, and
its behaviour logprobs are of that distribution. `allowed` [B, T, W] (int32
bitmask words per position, `clawrl/model/constrain.py: response_masks`,
rebuilt by replaying the grammar over the response) restricts z the same way in
each chunk: z_j for a token outside the allowed set is set to the lowest finite
float, so p_j = 0 exactly and its gradient is 0, and 0 * z_j stays 0 in the
entropy (-inf would make it NaN). Positions whose words are all ones (rows
without a grammar, padding) are unchanged, and without `allowed` nothing is
masked at all. A response the grammar refuses part-way (not decoded under it)
is masked up to that token and unmasked after, with a warning
(`constrain.replay`): there is no mask to rebuild past it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from clawrl.model.constrain import unpack

CHUNK_ELEMENTS = 1 << 23  # logits per chunk: 32 MB of float32 temporaries each


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, logits: Tensor, targets: Tensor, temp: Tensor, with_entropy: bool, allowed: Tensor | None
    ):
        b, n, c = targets.shape  # c tokens scored at each position: the target, then any others
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logp = torch.empty(b, n, c, dtype=dtype, device=logits.device)
        lse = torch.empty(b, n, dtype=dtype, device=logits.device)
        entropy = torch.zeros_like(lse)
        for lo, hi in _chunks(b, n, logits.shape[-1]):
            z = _masked(logits[:, lo:hi].to(dtype) / _at(temp, lo, hi), allowed, lo, hi)  # [B, c, V]
            lse[:, lo:hi] = torch.logsumexp(z, dim=-1)
            z -= lse[:, lo:hi, None]  # log p, in place
            logp[:, lo:hi] = z.gather(-1, targets[:, lo:hi])
            if with_entropy:
                entropy[:, lo:hi] = -(z.exp() * z).sum(-1)
            del z
        ctx.save_for_backward(logits, targets, temp, lse, entropy)
        ctx.allowed = allowed  # no gradient: kept as is, not saved for autograd
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        logits, targets, temp, lse, entropy = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        b, n, _ = targets.shape
        for lo, hi in _chunks(b, n, logits.shape[-1]):
            z = _masked(logits[:, lo:hi].to(lse.dtype) / _at(temp, lo, hi), ctx.allowed, lo, hi)
            logq = z - lse[:, lo:hi, None]  # log p [B, c, V]
            p = logq.exp()
            g = torch.zeros_like(p)
            if grad_logp is not None:  # sum over the tokens scored: 1[j = t] - p_j each
                gl = grad_logp[:, lo:hi]
                g.sub_(p * gl.sum(-1, keepdim=True)).scatter_add_(-1, targets[:, lo:hi], gl)
            if grad_entropy is not None and ctx.with_entropy:
                g.sub_(p * (logq + entropy[:, lo:hi, None]) * grad_entropy[:, lo:hi, None])
            grad[:, lo:hi] = g / _at(temp, lo, hi)
            del z, logq, p, g
        return grad, None, None, None, None


def _at(temp: Tensor, lo: int, hi: int) -> Tensor:
    """The temperatures of positions lo:hi: [B or 1, 1, 1] (one a row) as it is, [B, T, 1] sliced."""
    return temp if temp.shape[1] == 1 else temp[:, lo:hi]


def _masked(z: Tensor, allowed: Tensor | None, lo: int, hi: int) -> Tensor:
    """z [B, c, V] with the lowest finite value outside the allowed tokens of positions lo:hi."""
    if allowed is None:
        return z
    words = allowed[:, lo:hi]
    if bool((words == -1).all()):  # nothing masked in this chunk
        return z
    return z.masked_fill_(~unpack(words.to(z.device), z.shape[-1]), torch.finfo(z.dtype).min)


def _chunks(rows: int, positions: int, vocab: int) -> list[tuple[int, int]]:
    step = max(1, CHUNK_ELEMENTS // max(1, rows * vocab))
    return [(lo, min(lo + step, positions)) for lo in range(0, positions, step)]


def chunked_token_logprobs(
    logits: Tensor,
    targets: Tensor,
    temperature: float | Tensor,
    with_entropy: bool = True,
    allowed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(logp [B, T], entropy [B, T]) of targets [B, T] under softmax(logits[:, :T] / temperature).

    As `loss.token_logprobs`: temperature is a float, a per-sequence [B] tensor or a per-position
    [B, T] one (positions gathered from several rows: train/batch.py), 0 means 1,
    half-precision logits are scored in float32, negative targets read as token 0. Without
    `with_entropy` the entropy is zeros (and not differentiable). `allowed` [B, T, W]: each
    position's grammar mask as int32 bitmask words (see the module docstring); None: no mask.
    Targets [B, T, C] score C tokens at each position (a teacher's likeliest: train/topk.py), in
    one pass and one gradient over the logits: logp is then [B, T, C].
    """
    if targets.dim() not in (2, 3):
        raise ValueError(f"targets must be [B, T] or [B, T, C], got shape {tuple(targets.shape)}")
    several = targets.dim() == 3
    targets = targets if several else targets[..., None]
    if logits.dim() != 3 or logits.shape[0] != targets.shape[0] or logits.shape[1] < targets.shape[1]:
        raise ValueError(f"logits {tuple(logits.shape)} do not cover targets {tuple(targets.shape)}")
    temp = _temperatures(logits, temperature, targets.shape[:2])
    if allowed is not None and tuple(allowed.shape[:2]) != tuple(targets.shape[:2]):
        raise ValueError(f"masks {tuple(allowed.shape)} do not match targets {tuple(targets.shape)}")
    logp, entropy = _ChunkedLogprobs.apply(logits, targets.clamp(min=0), temp, with_entropy, allowed)
    return (logp if several else logp[..., 0]), entropy


@torch.no_grad()
def chunked_topk(
    logits: Tensor, temperature: float | Tensor, k: int, positions: int, allowed: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(ids [B, T, k], logp [B, T, k]): the k likeliest tokens at each of the first `positions`
    positions of softmax(logits / temperature), likeliest first, a few positions at a time (as
    `chunked_token_logprobs`, whose temperature and `allowed` it takes). No gradient: a teacher's."""
    b, vocab = logits.shape[0], logits.shape[-1]
    temp = _temperatures(logits, temperature, (b, positions))
    dtype = torch.promote_types(logits.dtype, torch.float32)
    ids = torch.empty(b, positions, k, dtype=torch.long, device=logits.device)
    logp = torch.empty(b, positions, k, dtype=dtype, device=logits.device)
    for lo, hi in _chunks(b, positions, vocab):
        z = _masked(logits[:, lo:hi].to(dtype) / _at(temp, lo, hi), allowed, lo, hi)
        top = z.topk(min(k, vocab), dim=-1)
        logp[:, lo:hi] = top.values - torch.logsumexp(z, dim=-1, keepdim=True)
        ids[:, lo:hi] = top.indices
        del z, top
    return ids, logp


def _temperatures(logits: Tensor, temperature: float | Tensor, shape: tuple[int, ...]) -> Tensor:
    """The temperature as [B or 1, 1, 1] or [B, T, 1] for positions of `shape` (B, T); 0 means 1."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    temp = torch.as_tensor(temperature, dtype=dtype, device=logits.device)
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))
    if temp.dim() == 2:
        if tuple(temp.shape) != tuple(shape):
            raise ValueError(f"temperatures {tuple(temp.shape)} do not match targets {tuple(shape)}")
        return temp[..., None]
    return temp.reshape(-1, 1, 1) if temp.dim() == 1 else temp.reshape(1, 1, 1)
