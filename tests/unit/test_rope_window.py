"""RoPE scaled only past the trained window (clawrl/model/rope.py), on the tiny model (trained
on 512 positions) served with a 2,048-token window.

A sequence that fits the trained window gets exactly the unscaled model's numbers; one that may
pass it gets exactly the statically scaled model's, from its first token. The engine records
which on the first token, the trainer scores a sample the way it was served, and the prefix
cache never hands one kind's KV to the other.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from clawrl.engine.base import SamplingParams
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.local.prefix_cache import PrefixCache
from clawrl.model import rope
from clawrl.model.load import load_model
from clawrl.train.batch import left_pad, score

WINDOW, TRAINED = 2048, 512


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    plain = load_model(tiny_model_dir, "cpu", "float32").model
    static = load_model(tiny_model_dir, "cpu", "float32", WINDOW, "yarn", "always").model
    windowed = load_model(tiny_model_dir, "cpu", "float32", WINDOW, "yarn", "past_window").model
    return plain, static, windowed


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_a_short_sequence_is_unscaled_and_a_long_one_scaled(models):
    plain, static, windowed = models
    assert rope.find(windowed).trained == TRAINED and rope.find(static) is None
    short, long = list(range(5, 205)), [5 + i % 900 for i in range(700)]
    assert torch.equal(_logits(windowed, short), _logits(plain, short))
    assert not torch.allclose(_logits(static, short), _logits(plain, short))  # static changes them all
    assert torch.equal(_logits(windowed, long), _logits(static, long))
    with rope.rope_rows(windowed, [True]):  # a short sequence served as one that may pass the window
        assert torch.equal(_logits(windowed, short), _logits(static, short))


def test_rows_of_one_batch_each_get_their_own(models):
    plain, static, windowed = models
    batch = left_pad(
        [list(range(5, 105)), list(range(7, 107))], [[11, 12, 13], [14, 15, 16]], torch.device("cpu")
    )
    temps = torch.ones(2)
    batch.rope = [True, False]
    mixed = score(windowed, batch, temps, with_entropy=False)[0]
    batch.rope = None
    assert torch.allclose(mixed[0], score(static, batch, temps, with_entropy=False)[0][0], atol=1e-5)
    assert torch.allclose(mixed[1], score(plain, batch, temps, with_entropy=False)[0][1], atol=1e-5)


def _serve(model, prompt: list[int], max_tokens: int, cache: PrefixCache | None = None):
    async def run():
        engine = LocalEngine(
            model,
            model_name="t",
            max_context=WINDOW,
            stop_token_ids=frozenset(),
            prefix_cache=cache,
            prefill_chunk=64,
        )
        await engine.start()
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            return [e async for e in engine.generate(prompt, params)]
        finally:
            await engine.stop()

    return asyncio.run(run())


def _recompute(model, prompt: list[int], response: list[int]) -> list[float]:
    logits = _logits(model, prompt + response)[len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


def test_the_engine_decides_per_request_and_records_it(models):
    plain, static, windowed = models
    prompt = [5 + i % 700 for i in range(300)]
    fits = _serve(windowed, prompt, 8)  # 308 <= 512: the model's own RoPE
    assert fits[0].rope_scaled is False and all(e.rope_scaled is None for e in fits[1:])
    ids = [e.token_id for e in fits]
    assert [e.logprob for e in fits] == pytest.approx(_recompute(plain, prompt, ids), abs=1e-4)
    may_pass = _serve(windowed, prompt, 300)  # 600 > 512: scaled from its first token
    assert may_pass[0].rope_scaled is True
    ids = [e.token_id for e in may_pass]
    assert [e.logprob for e in may_pass] == pytest.approx(_recompute(static, prompt, ids), abs=1e-4)


def test_the_prefix_cache_never_reuses_the_other_kinds_kv(models):
    _, _, windowed = models
    cache = PrefixCache(64 << 20)
    prompt = [5 + i % 700 for i in range(300)]
    _serve(windowed, prompt, 4, cache)  # unscaled: cached
    assert cache.stats.inserted == 1
    hits = cache.stats.hits
    _serve(windowed, prompt + [9, 9], 300, cache)  # scaled: the unscaled entry must not match
    assert cache.stats.hits == hits
    _serve(windowed, prompt + [9, 9], 4, cache)  # unscaled again: it does
    assert cache.stats.hits == hits + 1
