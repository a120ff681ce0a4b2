"""Token masks from grammars: the local engine samples under them, the trainer scores under them.

A grammar (`clawrl/chat/grammar.py`: {"kind", "lark"}) is compiled by llguidance against the
model's tokenizer into an `LLMatcher`, one per sequence (`Constraint`). Before each token it
says which tokens may come next, as a bitmask of int32 words (token t allowed when bit t % 32
of word t // 32 is set); then it consumes the token drawn. With z = logits / T:

    engine:   logp = log_softmax(z masked to -inf outside the allowed set)     (what it samples from)
    trainer:  the same, the allowed sets rebuilt by replaying the matcher over the response

so the behaviour logprob recorded at serving and the one the trainer computes are of the same
distribution. The tokenizer llguidance needs is the model folder's own (the folder the model
was loaded from, `config.name_or_path`), built once per folder: the server and the trainer
load the same folder, so they build the same masks. Its end-of-sequence token (the
tokenizer's, always one of the engine's stop tokens) is the only token allowed once the
grammar is complete.

Sequences without a grammar pay nothing: no matcher, no mask, the logits untouched.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)
ALL_ALLOWED = -1  # an int32 word with every bit set


class Constraint:
    """One sequence's grammar: which tokens may come next, fed with each token drawn."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: dict[str, Any]) -> None:
        self._matcher = llguidance.LLMatcher(
            tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar["lark"])
        )
        if self._matcher.is_error():
            raise ValueError(f"cannot compile the grammar: {self._matcher.get_error()}")
        self.words = (tokenizer.vocab_size + 31) // 32
        self._eos = list(tokenizer.eos_tokens)

    def fill(self, out: Tensor) -> None:
        """Write the next token's allowed set into `out`, int32 [words] on the CPU, contiguous."""
        self._matcher.unsafe_compute_mask_ptr(out.data_ptr(), out.numel() * out.element_size())
        if not bool(out.any()):  # a matcher in error allows nothing: end the sequence instead
            log.warning("grammar matcher stuck (%s): only end of sequence allowed", self._matcher.get_error())
            for token in self._eos:
                out[token // 32] |= _bit(token % 32)

    def advance(self, token: int) -> bool:
        """Consume the token drawn; False if the grammar did not allow it (the matcher is then stuck)."""
        return bool(self._matcher.consume_token(token))


def _bit(k: int) -> int:
    """Bit k of an int32 word, as a Python int that fits int32 (bit 31 is the sign bit)."""
    return -(1 << 31) if k == 31 else 1 << k


def tokenizer_of(model: Any) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for the folder `model` was loaded from (unwrapping DDP and PEFT)."""
    module = getattr(model, "module", model)
    folder = getattr(getattr(module, "config", None), "name_or_path", "")
    if not folder or not Path(folder).is_dir():
        raise ValueError(f"constrained decoding needs the model's folder for its tokenizer, got {folder!r}")
    return folder_tokenizer(folder)


def folder_tokenizer(folder: str | Path) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for a model folder's tokenizer, built once per folder (~0.5 s)."""
    return _tokenizer(str(Path(folder).resolve()))


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str) -> llguidance.LLTokenizer:
    from transformers import AutoTokenizer

    return llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(folder))


def unpack(bits: Tensor, vocab: int) -> Tensor:
    """Bitmask words [..., W] (int32) -> allowed [..., vocab] (bool); tokens past W * 32 are not allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    allowed = ((bits[..., None] >> shifts) & 1).bool().flatten(-2)  # [..., W * 32]
    if allowed.shape[-1] >= vocab:
        return allowed[..., :vocab]
    return torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]), value=False)


@torch.inference_mode()
def mask_logits_(logits: Tensor, constraints: list[Constraint | None]) -> None:
    """Set logits [B, V] (the model's, in place) to -inf outside each constrained row's allowed set.

    The bits are unpacked with numpy: a decoding step's mask is one small row per sequence, and
    torch's threads cost more than the work on so few elements. One torch op applies them all.
    """
    rows = [(i, c) for i, c in enumerate(constraints) if c is not None]
    if not rows:
        return
    bits = torch.empty(len(rows), rows[0][1].words, dtype=torch.int32)
    for j, (_, constraint) in enumerate(rows):
        constraint.fill(bits[j])
    vocab = logits.shape[-1]
    blocked = np.zeros(tuple(logits.shape), dtype=np.bool_)
    allowed = np.unpackbits(bits.numpy().view(np.uint8), axis=-1, bitorder="little").view(np.bool_)
    width = min(vocab, allowed.shape[-1])
    blocked[[i for i, _ in rows]] = True
    blocked[[i for i, _ in rows], :width] = ~allowed[:, :width]
    logits.masked_fill_(torch.from_numpy(blocked).to(logits.device), float("-inf"))


def replay(constraint: Constraint, tokens: list[int]) -> Tensor:
    """The allowed set before each of `tokens`, int32 words [len(tokens), W], rebuilt as decoded.

    A token outside the rebuilt mask (a response not decoded under this grammar, or decoded by a
    runtime that masked differently, e.g. vLLM's xgrammar backend, which lets any tokenisation of
    forced text through) leaves the rest of the response unmasked, with a warning: its logprob
    under this mask would be -inf, and past it there is no mask to rebuild.
    """
    bits = torch.full((len(tokens), constraint.words), ALL_ALLOWED, dtype=torch.int32)
    for t, token in enumerate(tokens):
        constraint.fill(bits[t])
        allowed = (int(bits[t, token // 32]) >> (token % 32)) & 1 if token // 32 < constraint.words else 0
        if not allowed or not constraint.advance(token):
            log.warning("token %d at position %d breaks the sample's grammar: unmasked from there", token, t)
            bits[t:] = ALL_ALLOWED
            break
    return bits


def response_masks(
    model: Any, grammars: list[dict[str, Any] | None], responses: list[list[int]], width: int
) -> Tensor | None:
    """Allowed sets of each response position, right-aligned as the trainer's targets: [B, width, W]
    int32 (row i's last R_i entries are its response's; every other entry allows all). None when
    no row has a grammar."""
    if not any(grammars):
        return None
    tokenizer = tokenizer_of(model)
    words = (tokenizer.vocab_size + 31) // 32
    bits = torch.full((len(responses), width, words), ALL_ALLOWED, dtype=torch.int32)
    for i, (grammar, response) in enumerate(zip(grammars, responses, strict=True)):
        if grammar is not None and response:
            bits[i, width - len(response) :] = replay(Constraint(tokenizer, grammar), response)
    return bits
