"""The local engine's scheduler as a state machine: no model, no thread, no event loop.

Each test plays the engine's part by hand (moving admitted requests into the running rows,
marking them done) and asserts which work the next iteration gets."""

from __future__ import annotations

import pytest

from clawrl.engine.base import SamplingParams
from clawrl.engine.local.sampling import RowSampler
from clawrl.engine.local.schedule import Job, Parked, Request, Scheduler


def _req(n: int, background: bool = False) -> Request:
    params = SamplingParams(max_tokens=8, background=background)
    return Request(list(range(n)), params, RowSampler.create(1.0, 1.0, 0, None))


def _job(background: bool = False) -> Job:
    return Job(run=lambda: None, future=None, background=background)  # type: ignore[arg-type]


def _scheduler(**kw) -> Scheduler:
    args = {"max_batch": 4, "prefill_budget": 64, "max_background": 2, "chunk": 32} | kw
    return Scheduler(**args)


def _prefilled(s: Scheduler, work) -> None:
    """What the engine does after prefilling a group: the rows join the batch."""
    s.rows += work


def test_waiting_requests_are_admitted_in_order_while_their_padded_prompts_fit_the_budget():
    s = _scheduler(prefill_budget=64)
    a, b, c = _req(20), _req(30), _req(10)
    s.waiting.extend([a, b, c])
    first = s.plan()
    assert first == [a, b]  # 2 x 30 padded = 60 <= 64; with c, 3 x 30 = 90 > 64
    assert list(s.waiting) == [c]


def test_after_a_prefill_the_running_rows_get_a_step_before_the_next_prefill():
    s = _scheduler()
    a, b = _req(10), _req(10)
    s.waiting.append(a)
    _prefilled(s, s.plan())
    s.waiting.append(b)
    assert s.plan() is None  # a decoding step of [a]
    assert s.plan() == [b]  # then b is admitted


def test_the_batch_never_grows_past_max_batch():
    s = _scheduler(max_batch=2, prefill_budget=10_000)
    reqs = [_req(5) for _ in range(3)]
    s.waiting.extend(reqs)
    assert s.plan() == reqs[:2]
    _prefilled(s, reqs[:2])
    assert s.plan() is None and s.plan() is None  # full: steps only, the third waits
    reqs[0].done = True
    s.rows = [r for r in s.rows if not r.done]  # the engine retires finished rows
    assert s.plan() == [reqs[2]]


def test_a_long_prompt_is_prefilled_alone_chunk_by_chunk_served_ones_first():
    s = _scheduler(chunk=32)
    judge, long, short = _req(100, background=True), _req(100), _req(8)
    s.waiting.extend([long, short])
    assert s.plan() == [short]  # the long one moved to chunking; the short one is a group
    assert s.chunking == [long]
    _prefilled(s, [short])
    assert s.plan() is None  # a step first
    assert s.plan() is long  # then the long prompt's next chunk
    s.chunking.append(judge)
    assert s.plan() is None
    assert s.plan() is long  # a served chunk before a background one


def test_background_requests_wait_while_a_served_request_is_active_and_are_bounded():
    """Not even in the served request's own prefill group: they would widen it, then be parked."""
    s = _scheduler(max_background=2)
    served = _req(8)
    judges = [_req(8, background=True) for _ in range(3)]
    s.waiting.extend([*judges, served])
    assert s.plan() == [served]  # the served request jumps the judges
    _prefilled(s, [served])
    assert s.plan() is None and s.plan() is None  # judges wait while it decodes
    served.done = True
    s.rows = []
    assert s.plan() == judges[:2]  # idle: at most max_background judges at once
    assert list(s.waiting) == [judges[2]]


def test_background_rows_are_parked_when_a_served_request_arrives_and_unparked_after():
    s = _scheduler()
    judge = _req(8, background=True)
    s.rows.append(judge)
    assert s.plan() is None  # the judge decodes while nothing is served
    served = _req(8)
    s.waiting.append(served)
    assert s.plan() == "park"
    s.rows, s.parked = [], Parked([judge], cache=None, mask=None)  # the engine sets it aside
    assert s.plan() == [served]
    assert s.queued() == 1  # the parked judge counts as waiting
    _prefilled(s, [served])
    assert s.plan() is None
    served.done = True
    s.rows = []
    assert s.plan() == "unpark"


def test_cancelled_requests_are_dropped_without_being_run():
    s = _scheduler(chunk=16)
    gone, long_gone, kept = _req(8), _req(40), _req(8)
    s.waiting.extend([gone, long_gone, kept])
    gone.cancelled = True
    assert s.plan() == [kept]
    assert s.chunking == [long_gone]
    long_gone.cancelled = True
    _prefilled(s, [kept])
    s.plan()  # a step
    assert s.plan() is None and s.chunking == []  # the cancelled long prompt is gone


def test_swaps_run_at_once_and_scoring_jobs_one_an_iteration_in_idle_gaps():
    s = _scheduler()
    served = _req(8)
    s.rows.append(served)
    earlier = _job(background=True)
    earlier.seconds = 1.0
    s.ran([earlier], now=0.0)  # a vote just took 1 s: scoring is not due while serving
    swap, score1, score2 = _job(), _job(background=True), _job(background=True)
    s.jobs += [score1, swap, score2]
    assert s.take_jobs(now=0.0) == [swap]  # serving and no share due: the swap, no scoring
    served.done = True
    s.rows = []
    assert s.take_jobs(now=0.0) == [score1]  # idle: one scoring job an iteration
    assert not s.idle()
    assert s.take_jobs(now=0.0) == [score2]
    assert s.idle()


def test_while_serving_scoring_jobs_still_get_their_share_of_the_time():
    """A server that is never idle still judges: after a job of d seconds the next may run once
    serving has had d * (1 - share) / share seconds."""
    s = _scheduler(background_share=0.2)
    s.rows.append(_req(8))  # a served request decodes throughout
    jobs = [_job(background=True) for _ in range(3)]
    s.jobs += jobs
    assert s.take_jobs(now=0.0) == [jobs[0]]  # nothing ran yet: due at once
    jobs[0].seconds = 0.1
    s.ran([jobs[0]], now=1.0)  # next due at 1.0 + 0.1 * 0.8 / 0.2 = 1.4
    assert s.take_jobs(now=1.2) == []
    assert s.take_jobs(now=1.41) == [jobs[1]]
    jobs[1].seconds = 0.5
    s.ran([jobs[1]], now=1.9)  # next due at 1.9 + 2.0
    assert s.take_jobs(now=3.8) == []
    assert s.take_jobs(now=3.91) == [jobs[2]]


def test_the_background_share_must_be_a_share():
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="background_share"):
            _scheduler(background_share=bad)


def test_a_failed_iteration_ends_the_running_rows_and_what_it_admitted_and_no_one_else():
    s = _scheduler(chunk=16)
    running, admitted, long, waiting = _req(8), _req(8), _req(40), _req(8)
    s.rows.append(running)
    s.chunking.append(long)
    s.waiting.append(waiting)
    assert s.fail([admitted]) == [running, admitted]
    assert running.done and admitted.done and s.rows == []
    assert s.chunking == [long] and list(s.waiting) == [waiting] and not long.done
    assert s.fail(long) == [long] and s.chunking == []


def test_with_a_kv_budget_a_request_waits_until_the_padded_kv_of_the_batch_fits():
    """Admitted by KV bytes, not rows: rows pad to the longest prompt + max_tokens (8 here)."""
    s = _scheduler(max_batch=16, prefill_budget=10_000, kv_tokens=100)
    a, b, c = _req(22), _req(22), _req(32)  # at most 30, 30 and 40 positions
    s.waiting.extend([a, b, c])
    group = s.plan()
    assert group == [a, b]  # with c: 3 rows x 40 = 120 > 100
    _prefilled(s, group)
    assert s.plan() is None and s.plan() is None  # steps: c still does not fit
    assert list(s.waiting) == [c]
    a.done = True
    s.rows = [b]  # the engine retires a
    assert s.plan() == [c]  # 2 x 40 = 80


def test_a_request_alone_is_admitted_whatever_the_kv_budget_and_without_one_rows_bound_the_batch():
    s = _scheduler(kv_tokens=10)
    a = _req(22)
    s.waiting.append(a)
    assert s.plan() == [a]
    unbounded = _scheduler(max_batch=16, prefill_budget=10_000)
    reqs = [_req(30) for _ in range(5)]
    unbounded.waiting.extend(reqs)
    assert unbounded.plan() == reqs
