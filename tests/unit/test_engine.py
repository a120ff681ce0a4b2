"""The local engine on a tiny random model: batching, scoring, swaps, cancellation, sampling."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.engine.base import SamplingParams
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.local.sampling import RowSampler, sample_rows

STOP = frozenset({2})


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def run(coro):
    return asyncio.run(coro)


async def _with_engine(model, body, **kw):
    engine = LocalEngine(model, model_name="t", max_context=512, stop_token_ids=STOP, **kw)
    await engine.start()
    try:
        return await body(engine)
    finally:
        await engine.stop()


def _greedy_reference(model, prompt, n):
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


PROMPTS = [[1, 520, 9531, 198], list(range(300, 340)), [5, 6, 7, 8, 9, 10, 11], list(range(1000, 1013))]


def test_batched_greedy_matches_one_at_a_time(tiny_model):
    lengths = [20, 7, 30, 12]  # rows leave at different steps
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]

    async def body(engine):
        async def one(i):
            await asyncio.sleep(0.01 * i)  # rows join a running batch
            return [e.token_id async for e in engine.generate(PROMPTS[i], params[i])]

        outs = await asyncio.gather(*[one(i) for i in range(4)])
        return outs, engine.stats()

    outs, stats = run(_with_engine(tiny_model, body))
    for prompt, n, out in zip(PROMPTS, lengths, outs, strict=True):
        assert out == _greedy_reference(tiny_model, prompt, n)
    assert stats.steps < sum(lengths), "rows were not decoded together"
    assert stats.active == 0 and stats.requests_finished == 4


def test_score_reproduces_the_logprobs_recorded_while_sampling(tiny_model):
    params = SamplingParams(max_tokens=15, temperature=0.7, seed=4, ignore_eos=True)

    async def body(engine):
        events = [e async for e in engine.generate(PROMPTS[1], params)]
        scores = await engine.score(PROMPTS[1], [e.token_id for e in events], temperature=0.7)
        return events, scores

    events, scores = run(_with_engine(tiny_model, body))
    assert len(scores) == 15
    for event, score in zip(events, scores, strict=True):
        assert event.logprob < 0
        assert math.isclose(event.logprob, score, abs_tol=1e-4)


def test_weight_swap_lands_between_steps_of_a_running_request(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)

    def flatten(m):  # all logits equal: greedy picks token 0 from now on
        m.model.norm.weight.zero_()

    async def body(engine):
        events = []
        async for event in engine.generate(PROMPTS[0], params):
            events.append(event)
            if len(events) == 5:
                swap = asyncio.create_task(engine.swap_weights(flatten, "v1"))
        await swap
        return events, engine.version

    events, version = run(_with_engine(model, body))
    assert version == "v1"
    assert len(events) == 30 and events[-1].finish_reason == "length"
    versions = [e.version for e in events]
    first_new = versions.index("v1")
    assert 5 <= first_new <= 7 and set(versions[first_new:]) == {"v1"}
    assert all(e.token_id == 0 for e in events[first_new + 1 :])
    assert any(e.token_id != 0 for e in events[:first_new])


def test_closing_the_stream_drops_the_request(tiny_model):
    params = SamplingParams(max_tokens=400, temperature=1.0, ignore_eos=True)

    async def body(engine):
        stream = engine.generate(PROMPTS[2], params)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if engine.stats().active == 0:
                break
        return engine.stats()

    stats = run(_with_engine(tiny_model, body))
    assert stats.active == 0 and stats.requests_cancelled == 1
    assert stats.tokens_generated < 50


def test_stop_token_and_length_finish_reasons(tiny_model):
    async def body(engine):
        greedy = [e async for e in engine.generate(PROMPTS[3], SamplingParams(max_tokens=4, temperature=0))]
        first = greedy[0].token_id
        engine.stop_token_ids = frozenset({first})
        stopped = [
            e
            async for e in engine.generate(
                PROMPTS[3], SamplingParams(max_tokens=4, temperature=0, stop_token_ids=frozenset({first}))
            )
        ]
        return greedy, stopped

    greedy, stopped = run(_with_engine(tiny_model, body))
    assert [e.finish_reason for e in greedy] == [None, None, None, "length"]
    assert len(stopped) == 1 and stopped[0].finish_reason == "stop"


def test_sampler_greedy_top_p_and_seed():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    greedy = sample_rows(logits, [RowSampler.create(0.0, 1.0, 2, None)] * 3)
    assert [s.token_id for s in greedy] == logits.argmax(-1).tolist()
    assert greedy[0].logprob == pytest.approx(torch.log_softmax(logits[0], -1).max().item())
    assert [t for t, _ in greedy[0].top] == logits[0].topk(2).indices.tolist()
    nucleus = sample_rows(logits, [RowSampler.create(1.0, 0.0, 0, None) for _ in range(3)])
    assert [s.token_id for s in nucleus] == logits.argmax(-1).tolist()
    a = [s.token_id for _ in range(5) for s in sample_rows(logits[:1], [RowSampler.create(1.0, 1.0, 0, 7)])]
    assert len(set(a)) == 1  # a fresh generator with the same seed draws the same token
    hot = sample_rows(logits[:1], [RowSampler.create(2.0, 1.0, 0, 3)])[0]
    expected = torch.log_softmax(logits[0] / 2.0, -1)[hot.token_id].item()
    assert hot.logprob == pytest.approx(expected, abs=1e-6)


def test_background_requests_wait_for_served_ones(tiny_model):
    """Judge calls (background) never take a batch slot a served request is waiting for."""
    served = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    judge = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, background=True)
    order: list[str] = []

    async def body(engine):
        async def one(name, params):
            async for _ in engine.generate(PROMPTS[0], params):
                pass
            order.append(name)

        tasks = [asyncio.create_task(one(f"judge{i}", judge)) for i in range(3)]
        tasks += [asyncio.create_task(one(f"user{i}", served)) for i in range(2)]
        await asyncio.gather(*tasks)

    # One row at a time: whoever is admitted first finishes first.
    run(_with_engine(tiny_model, body, max_batch_size=1, max_background_rows=1))
    assert order[:2] == ["user0", "user1"]
    assert sorted(order[2:]) == ["judge0", "judge1", "judge2"]


def test_long_prompts_are_prefilled_in_chunks_between_steps(tiny_model):
    """A long prompt joins after several chunks; greedy output is unchanged, and short rows keep stepping."""
    long_prompt = list(range(2000, 2090))  # 90 tokens: 12 chunks of 8
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def body(engine):
        async def one(prompt, delay):
            await asyncio.sleep(delay)
            return [e.token_id async for e in engine.generate(prompt, params)]

        return await asyncio.gather(one(PROMPTS[0], 0), one(long_prompt, 0.02), one(PROMPTS[2], 0.04))

    outs = run(_with_engine(tiny_model, body, prefill_chunk=8))
    for prompt, out in zip([PROMPTS[0], long_prompt, PROMPTS[2]], outs, strict=True):
        assert out == _greedy_reference(tiny_model, prompt, 12)


def test_background_rows_step_aside_while_a_served_request_decodes(tiny_model):
    """A judge call in progress is parked (its cache kept) while a served request runs, then resumes."""
    judge = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, background=True)
    served = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    finished: list[str] = []

    async def body(engine):
        async def background():
            out = []
            async for e in engine.generate(PROMPTS[1], judge):
                out.append(e.token_id)
                if len(out) == 3:
                    user_task.append(asyncio.create_task(user()))
            finished.append("judge")
            return out

        async def user():
            out = [e.token_id async for e in engine.generate(PROMPTS[0], served)]
            finished.append("user")
            return out

        user_task: list[asyncio.Task] = []
        judged = await background()
        return judged, await user_task[0], engine.stats()

    judged, answered, stats = run(_with_engine(tiny_model, body))
    assert finished == ["user", "judge"]  # the served request did not wait behind the judge call
    assert judged == _greedy_reference(tiny_model, PROMPTS[1], 30)  # parking kept its cache intact
    assert answered == _greedy_reference(tiny_model, PROMPTS[0], 5)
    assert stats.active == 0 and stats.waiting == 0


def _judge_beside_a_stream(model, share: float, stream_tokens: int) -> tuple[list[str], list, list]:
    """Ask the judge's label likelihoods (`next_token_logprobs`, `score`) while a stream decodes;
    what finished first, and the likelihoods asked while idle and while busy."""
    served = SamplingParams(max_tokens=stream_tokens, temperature=0, ignore_eos=True)
    order: list[str] = []

    async def body(engine):
        idle = await engine.next_token_logprobs(PROMPTS[2], [5, 6, 7])
        started = asyncio.Event()

        async def user():
            async for _ in engine.generate(PROMPTS[0], served):
                started.set()
            order.append("stream done")

        async def judge():
            await started.wait()
            out = await engine.next_token_logprobs(PROMPTS[2], [5, 6, 7])
            assert len(await engine.score(PROMPTS[2], [5, 6])) == 2
            order.append("judge done")
            return out

        busy = (await asyncio.gather(user(), judge()))[1]
        return idle, busy

    idle, busy = run(_with_engine(model, body, background_share=share))
    return order, idle, busy


def test_judge_scoring_waits_for_a_gap_in_serving_past_its_share(tiny_model):
    """With almost no share of a busy engine, the judge's scoring comes back after the stream's
    last token, with the same numbers as when idle. (A weight swap does not wait: the test of
    swaps between steps.)"""
    order, idle, busy = _judge_beside_a_stream(tiny_model, share=1e-9, stream_tokens=24)
    assert order == ["stream done", "judge done"]
    assert busy == pytest.approx(idle, abs=1e-5)


def test_a_server_that_is_never_idle_still_judges(tiny_model):
    """Within its share (here all of it) the judge's scoring runs between decoding steps of a
    stream that never pauses, and is done long before it ends."""
    order, idle, busy = _judge_beside_a_stream(tiny_model, share=1.0, stream_tokens=200)
    assert order == ["judge done", "stream done"]
    assert busy == pytest.approx(idle, abs=1e-5)


def test_the_prefix_cache_budget_is_the_configured_one_else_a_gigabyte_on_a_cpu():
    from torch import nn

    from clawrl.engine.local.build import prefix_cache_budget

    model = nn.Linear(2, 2)
    assert prefix_cache_budget(None, model) == 1 << 30
    assert prefix_cache_budget(64, model) == 64 << 20
    assert prefix_cache_budget(0, model) == 0  # off
