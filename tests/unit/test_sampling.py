"""The local engine's sampler over the batch at once (engine/local/sampling.py) against the
row-by-row one it replaced, kept here as the reference: the same penalised logits, the same top-k
and top-p masks, the same probabilities, so the same tokens and logprobs for the same noise."""

from __future__ import annotations

import itertools

import torch

from clawrl.engine.local.penalties import Penalties, PenaltyState
from clawrl.engine.local.sampling import RowSampler, _penalised, _truncate, sample_rows

VOCAB = 5000  # past NUCLEUS_CANDIDATES: the heads' and the whole row's sorts are taken


# The reference: the sampler as it was (2026-11-25), one row at a time.
def _ref_apply(state: PenaltyState, logits: torch.Tensor) -> torch.Tensor:
    seen, counts = state.tensors(logits.shape[-1], logits.device)
    p, out = state.penalties, logits
    if p.repetition != 1.0:
        scaled = torch.where(out > 0, out / p.repetition, out * p.repetition)
        scaled = scaled.clamp(max=torch.finfo(scaled.dtype).max)
        out = torch.where(seen, scaled, out)
    if p.frequency != 0.0:
        out = out - p.frequency * counts
    if p.presence != 0.0:
        out = out - p.presence * (counts > 0).float()
    return out


def _ref_penalised(logits, logprobs, temps, rows):
    if all(r.penalty is None for r in rows):
        return logprobs
    shaped = logits.clone()
    for i, row in enumerate(rows):
        if row.penalty is not None:
            shaped[i] = _ref_apply(row.penalty, logits[i])
    return torch.log_softmax(shaped / temps[:, None], dim=-1)


def _ref_top_k(probs, k):
    kth = probs.topk(k).values[-1]
    return probs.masked_fill(probs < kth, 0.0)


def _ref_nucleus(probs, top_p):
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs
    cut = before >= top_p
    cut[0] = False
    sorted_probs[cut] = 0.0
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs)


def _ref_truncate(probs, rows):
    probs = probs.clone()
    for j, row in enumerate(rows):
        if 0 < row.top_k < probs.shape[-1]:
            probs[j] = _ref_top_k(probs[j], row.top_k)
        if row.top_p < 1.0:
            probs[j] = _ref_nucleus(probs[j], row.top_p)
    return probs


def _ref_sample_rows(logits, rows):
    logits = logits.float()
    temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows])
    logprobs = _ref_penalised(logits, torch.log_softmax(logits / temps[:, None], dim=-1), temps, rows)
    chosen = logprobs.argmax(dim=-1)
    drawn = logprobs.gather(1, chosen[:, None]).squeeze(1)
    hot = [i for i, r in enumerate(rows) if r.temperature > 0]
    if hot:
        probs = _ref_truncate(logprobs[hot].exp(), [rows[i] for i in hot])
        uniform = torch.empty_like(probs)
        if all(rows[i].generator is None for i in hot):
            uniform.uniform_()
        else:
            for j, i in enumerate(hot):
                uniform[j].uniform_(generator=rows[i].generator)
        picks = (probs / -uniform.log()).argmax(dim=-1)
        chosen[hot] = picks
        drawn[hot] = (probs.gather(1, picks[:, None]).squeeze(1) / probs.sum(-1)).log()
    for row, token in zip(rows, chosen.tolist(), strict=True):
        if row.penalty is not None:
            row.penalty.observe(token)
    return chosen.tolist(), drawn.tolist()


# (temperature, top_p, top_k, penalties, seed): every cut alone and together, greedy among them
MIXED = [
    (0.2, 0.9, 0, Penalties(frequency=0.5, presence=0.5), 1),  # the embedded model's own defaults
    (1.0, 1.0, 0, Penalties(), None),
    (0.7, 0.5, 40, Penalties(repetition=1.3), 2),
    (1.0, 0.95, 0, Penalties(), 3),  # a wide nucleus: past the head, the whole row is sorted
    (0.0, 0.9, 0, Penalties(frequency=1.0), None),  # greedy
    (1.0, 1.0, 7, Penalties(repetition=0.8, presence=0.3), None),
    (0.5, 0.0, 0, Penalties(), 4),  # top_p 0: the most likely token
    (1.3, 0.8, VOCAB + 5, Penalties(frequency=0.2), 5),  # k past the vocabulary: no cut
]


def _rows(params) -> list[RowSampler]:
    prompt = [3, 17, 17, 400, 4999]
    return [
        RowSampler.create(t, p, 2, seed, top_k=k, penalties=pen, prompt_ids=prompt)
        for t, p, k, pen, seed in params
    ]


def _logits(batch: int, scale: float, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def test_the_batch_cuts_and_penalties_equal_the_row_by_row_ones_exactly():
    nucleus = [p for p in MIXED if p[1] < 1.0]  # every row cut: the head's sort where it holds them
    for params, scale in itertools.product((MIXED, nucleus), (1.0, 4.0, 12.0)):  # flat to peaked
        rows, ref = _rows(params), _rows(params)
        for step in range(3):  # the penalties see the tokens drawn before
            logits = _logits(len(params), scale, step)
            temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows])
            logprobs = torch.log_softmax(logits / temps[:, None], dim=-1)
            shaped = _penalised(logits, logprobs, temps, rows)
            assert torch.equal(shaped, _ref_penalised(logits, logprobs, temps, ref))
            hot = [i for i, r in enumerate(rows) if r.temperature > 0]
            probs = shaped[hot].exp()
            cut = _truncate(probs, [rows[i] for i in hot])
            expected = _ref_truncate(probs, [ref[i] for i in hot])
            assert torch.equal(cut > 0, expected > 0), (scale, step)  # the same tokens kept
            assert torch.equal(cut, expected)  # with the same probabilities
            for i, token in enumerate([7 * step + 1] * len(rows)):
                for r in (rows[i], ref[i]):
                    if r.penalty is not None:
                        r.penalty.observe(token)


def test_the_batch_sampler_draws_what_the_row_by_row_one_drew():
    """The same tokens and logprobs step after step, seeded rows and unseeded (the same global noise),
    with every row under its own penalties, and with only some rows penalised."""
    for params in (MIXED, MIXED[:1] * 8, [(0.2, 0.9, 0, Penalties(), None)] * 8):
        rows, ref = _rows(params), _rows(params)
        for step in range(6):
            logits = _logits(len(params), 3.0, 100 + step)
            torch.manual_seed(step)
            got = sample_rows(logits, rows)
            torch.manual_seed(step)
            ids, logps = _ref_sample_rows(logits, ref)
            assert [s.token_id for s in got] == ids
            assert [s.logprob for s in got] == logps


def test_a_nucleus_reaching_past_the_head_sorts_the_whole_row():
    """A flat row needs most of the vocabulary to reach top_p: its nucleus is more than the head."""
    flat = torch.softmax(_logits(2, 0.01), dim=-1)
    rows = _rows([(1.0, 0.9, 0, Penalties(), None), (1.0, 0.5, 0, Penalties(), None)])
    kept = (_truncate(flat, rows) > 0).sum(-1).tolist()
    assert kept[0] > 4000 and 2000 < kept[1] < 3000, kept
