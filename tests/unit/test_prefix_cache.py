"""The prefix cache on its own (longest prefix, budget, versions) and inside the local engine."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.engine.base import SamplingParams
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.local.prefix_cache import PrefixCache

LAYERS, HEADS, DIM = 2, 2, 4
PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4  # bytes of float32 keys and values per token


def kv_for(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake KV whose every position holds its token id, so a slice shows which positions it kept."""
    x = torch.tensor(ids, dtype=torch.float32)[None, None, :, None].expand(1, HEADS, len(ids), DIM)
    return [(x.clone(), -x.clone()) for _ in range(LAYERS)]


def test_longest_common_prefix_is_found_token_by_token():
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4, 5, 6], kv_for([1, 2, 3, 4, 5, 6]), "v0")
    cache.insert([1, 2, 9, 9], kv_for([1, 2, 9, 9]), "v0")
    n, kv = cache.lookup([1, 2, 3, 4, 7, 7, 7], "v0")
    assert n == 4
    keys, values = kv[0]
    assert keys.shape == (1, HEADS, 4, DIM) and keys[0, 0, :, 0].tolist() == [1, 2, 3, 4]
    assert values[0, 0, :, 0].tolist() == [-1, -2, -3, -4]
    assert cache.stats.hits == 1 and cache.stats.hit_tokens == 4


def test_a_hit_leaves_the_last_prompt_token_to_prefill():
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]), "v0")
    assert cache.lookup([1, 2, 3], "v0")[0] == 2  # its logits are needed to sample the first token
    assert cache.lookup([1, 2, 3, 4], "v0")[0] == 3
    assert cache.lookup([7, 8], "v0") == (0, None)
    assert cache.lookup([1], "v0") == (0, None)


def test_entries_of_another_version_are_never_matched_unless_allowed():
    strict, loose = PrefixCache(1 << 20), PrefixCache(1 << 20, across_versions=True)
    for cache in (strict, loose):
        cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]), "v0")
    assert strict.lookup([1, 2, 3, 4, 5], "v1") == (0, None)
    assert loose.lookup([1, 2, 3, 4, 5], "v1")[0] == 4


def test_least_recently_used_entries_are_evicted_past_the_budget():
    cache = PrefixCache(10 * PER_TOKEN)  # room for 10 tokens
    cache.insert([1, 1, 1, 1], kv_for([1, 1, 1, 1]), "v0")
    cache.insert([2, 2, 2, 2], kv_for([2, 2, 2, 2]), "v0")
    assert cache.lookup([1, 1, 1, 1, 5], "v0")[0] == 4  # 1s are now the most recently used
    cache.insert([3, 3, 3, 3], kv_for([3, 3, 3, 3]), "v0")
    assert cache.nbytes <= 10 * PER_TOKEN and len(cache) == 2
    assert cache.lookup([2, 2, 2, 2, 5], "v0") == (0, None)  # evicted
    assert cache.lookup([1, 1, 1, 1, 5], "v0")[0] == 4
    assert cache.stats.evicted == 1


def test_an_entry_larger_than_the_budget_is_not_kept_and_is_no_error():
    cache = PrefixCache(3 * PER_TOKEN)
    assert cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]), "v0") is False
    assert len(cache) == 0 and cache.nbytes == 0


def test_a_longer_prompt_of_the_same_conversation_replaces_its_prefix():
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]), "v0")
    cache.insert([1, 2, 3, 4, 5], kv_for([1, 2, 3, 4, 5]), "v0")
    assert len(cache) == 1 and cache.nbytes == 5 * PER_TOKEN
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup([1, 2, 3, 4], "v0") == (0, None)


def test_a_users_entries_match_only_that_users_lookups_whatever_the_version():
    """Another user's prompt is never reused nor counted: `cached_tokens` would tell a user how much
    of their prompt someone else sent (docs/security.md)."""
    cache = PrefixCache(1 << 20, across_versions=True)
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]), "v0", user="alice")
    assert cache.lookup([1, 2, 3, 4, 5], "v0", user="bob") == (0, None)
    assert cache.lookup([1, 2, 3, 4, 5], "v0") == (0, None)  # the default user's (the admin key's)
    assert cache.lookup([1, 2, 3, 4, 5], "alice/v1", user="alice")[0] == 4
    cache.insert([1, 2, 3, 4, 5, 6], kv_for([1, 2, 3, 4, 5, 6]), "v0", user="bob")
    assert len(cache) == 2  # bob's longer prompt does not replace alice's entry


def test_drop_user_forgets_only_that_users_entries():
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]), "v0", user="alice")
    cache.insert([7, 8, 9], kv_for([7, 8, 9]), "v0", user="alice")
    cache.insert([1, 2, 3], kv_for([1, 2, 3]), "v0", user="bob")
    assert cache.drop_user("alice") == 2
    assert len(cache) == 1 and cache.nbytes == 3 * PER_TOKEN
    assert cache.lookup([1, 2, 3, 4], "v0", user="alice") == (0, None)
    assert cache.lookup([1, 2, 3, 4], "v0", user="bob")[0] == 3


# --- inside the engine, on a tiny random model --------------------------------------------------

SYSTEM = list(range(2000, 2300))  # a 300-token "system prompt": longer than one prefill chunk


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


async def _generate(engine, prompt, n=8, user="default"):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, adapter=user)
    return [e async for e in engine.generate(prompt, params)]


async def _engine(model, cache):
    engine = LocalEngine(
        model,
        model_name="t",
        max_context=512,
        stop_token_ids=frozenset({2}),
        prefill_chunk=64,
        prefix_cache=cache,
    )
    await engine.start()
    return engine


def test_a_prompt_that_starts_like_a_cached_one_prefills_only_the_rest(tiny_model):
    first, second = SYSTEM + [5, 6, 7], SYSTEM + [5, 6, 7, 8, 9] + list(range(40, 60))

    async def body():
        cached = await _engine(tiny_model, PrefixCache(64 << 20))
        plain = await _engine(tiny_model, None)
        try:
            a = await _generate(cached, first)
            b = await _generate(cached, second)
            reference = await _generate(plain, second)
        finally:
            await cached.stop()
            await plain.stop()
        return a, b, reference, cached.stats()

    a, b, reference, stats = asyncio.run(body())
    assert a[0].cached_tokens == 0 and b[0].cached_tokens == len(first)
    assert all(e.cached_tokens == 0 for e in b[1:])
    assert [e.token_id for e in b] == [e.token_id for e in reference]
    assert [e.logprob for e in b] == pytest.approx([e.logprob for e in reference], abs=1e-4)
    pc = stats.extra["prefix_cache"]
    assert pc["hits"] == 1 and pc["hit_tokens"] == len(first) and pc["entries"] == 1


def test_a_user_never_starts_from_another_users_prompt_and_forgetting_drops_theirs(tiny_model):
    """alice's prompt is cached; bob's same prompt counts 0 cached tokens and is answered as with no
    cache; once alice is forgotten (her data erased) her own prompt is prefilled again."""
    prompt = SYSTEM + [5, 6, 7]

    async def body():
        cached = await _engine(tiny_model, PrefixCache(64 << 20, across_versions=True))
        plain = await _engine(tiny_model, None)
        try:
            alice = await _generate(cached, prompt, user="alice")
            bob = await _generate(cached, prompt + [8], user="bob")
            again = await _generate(cached, prompt + [8], user="alice")
            await cached.forget_user("alice")
            forgotten = await _generate(cached, prompt + [8], user="alice")
            reference = await _generate(plain, prompt + [8])
        finally:
            await cached.stop()
            await plain.stop()
        return alice, bob, again, forgotten, reference

    alice, bob, again, forgotten, reference = asyncio.run(body())
    assert alice[0].cached_tokens == 0 and bob[0].cached_tokens == 0
    assert again[0].cached_tokens == len(prompt)  # her own prompt: reused
    assert forgotten[0].cached_tokens == 0
    for answer in (bob, again, forgotten):
        assert [e.token_id for e in answer] == [e.token_id for e in reference]


def test_after_a_swap_no_prompt_starts_from_the_old_weights_cache(tiny_model_dir):
    prompt = SYSTEM + [11, 12, 13]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def perturb(m):
        for p in m.parameters():
            p.mul_(1.5)

    with torch.no_grad():
        perturb(fresh)

    async def body():
        engine = await _engine(model, PrefixCache(64 << 20))
        reference = await _engine(fresh, None)
        try:
            await _generate(engine, prompt)
            assert engine.stats().extra["prefix_cache"]["entries"] == 1
            await engine.swap_weights(perturb, "v1")
            assert engine.stats().extra["prefix_cache"]["bytes"] == 0  # the old weights' KV is freed
            after = await _generate(engine, prompt + [14])
            expected = await _generate(reference, prompt + [14])
        finally:
            await engine.stop()
            await reference.stop()
        return after, expected

    after, expected = asyncio.run(body())
    assert after[0].cached_tokens == 0 and after[0].version == "v1"
    assert [e.token_id for e in after] == [e.token_id for e in expected]
    assert [e.logprob for e in after] == pytest.approx([e.logprob for e in expected], abs=1e-4)


def test_across_versions_the_longest_entry_wins_and_the_serving_versions_wins_a_tie():
    cache = PrefixCache(1 << 20, across_versions=True)
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]), "v0")
    assert cache.lookup([1, 2, 3, 4, 5], "v1")[0] == 4 and cache.last_hit_version == "v0"
    cache.insert([9, 9, 9], kv_for([9, 9, 9]), "v1")
    cache.insert([1, 2, 3, 4, 6], kv_for([1, 2, 3, 4, 6]), "v1")  # holds v0's [1, 2, 3, 4]: it replaces it
    assert len(cache) == 2
    assert cache.lookup([1, 2, 3, 4, 5], "v1")[0] == 4 and cache.last_hit_version == "v1"
    cache.insert([7, 7], kv_for([7, 7]), "v0")
    cache.insert([7, 7, 8], kv_for([7, 7, 8]), "v0")
    cache.insert([7, 7, 5], kv_for([7, 7, 5]), "v1")
    assert cache.lookup([7, 7, 8, 1], "v1")[0] == 3 and cache.last_hit_version == "v0"  # longer beats own
    assert cache.lookup([7, 7, 2], "v1")[0] == 2 and cache.last_hit_version == "v1"  # a tie: its own
    assert cache.lookup([4, 4], "v1") == (0, None) and cache.last_hit_version is None


def test_across_versions_a_swap_keeps_the_cache_and_the_turn_names_the_older_kv(tiny_model_dir):
    """`engine.prefix_cache_across_versions` (the default): after a swap the agent's prompt is not
    prefilled again; the first token says which older version computed the KV it started from, and
    the prompt kept after it is salted with that older version."""
    prompt = SYSTEM + [11, 12, 13]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def perturb(m):
        for p in m.parameters():
            p.mul_(1.5)

    async def body():
        cache = PrefixCache(64 << 20, across_versions=True)
        engine = await _engine(model, cache)
        try:
            before = await _generate(engine, prompt)
            await engine.swap_weights(perturb, "v1")
            after = await _generate(engine, prompt + [14])
            again = await _generate(engine, prompt + [14, 15, 16])
        finally:
            await engine.stop()
        return before, after, again, cache

    before, after, again, cache = asyncio.run(body())
    assert before[0].cached_version is None
    assert after[0].cached_tokens == len(prompt) and after[0].version == "v1"
    assert after[0].cached_version == "v0" and all(e.cached_version is None for e in after[1:])
    assert again[0].cached_tokens == len(prompt) + 1 and again[0].cached_version == "v0"
    assert cache.stats.cleared == 0


def test_the_turn_records_the_older_version_whose_kv_it_started_from():
    from clawrl.api.responses import Completion
    from clawrl.engine.base import TokenEvent, sampling_record

    params = SamplingParams(max_tokens=4)
    assert "prefix_kv_version" not in sampling_record(params, False)
    assert sampling_record(params, False, "v2")["prefix_kv_version"] == "v2"
    completion = Completion("c1", 0, "m", [1, 2, 3])
    completion.add(TokenEvent(5, -1.0, "v3", cached_tokens=2, cached_version="v2"))
    completion.add(TokenEvent(6, -1.0, "v3"))
    assert (
        completion.cached_version == "v2"
        and completion.usage()["prompt_tokens_details"]["cached_tokens"] == 2
    )
