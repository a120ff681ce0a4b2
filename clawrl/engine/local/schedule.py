"""The local engine's scheduler: which requests and jobs the next iteration runs.

A state machine over the engine's queues, with no torch, threads or sockets: the engine
(`clawrl/engine/local/engine.py`) asks `plan()` and `take_jobs()` before each iteration and
carries the answer out in its worker thread. The queues:

    waiting   requests not yet admitted, in arrival order
    chunking  long prompts (over `chunk` tokens), prefilled one chunk per iteration; served first
    rows      the running batch, one decoding step per iteration
    parked    background rows (judge calls) set aside while served requests decode
    jobs      scoring (background) and weight swaps, run at the start of an iteration

The rules:
- after any prefill work the running rows get a step, so arrivals never starve decoding;
- admission takes waiting requests in order while the batch has room and their padded
  prompts fit `prefill_budget`; a longer prompt is prefilled alone, chunk by chunk;
- with a KV budget (`kv_tokens`, on a GPU: the memory budget's, clawrl/model/budget.py) a request
  is admitted only if the KV everything admitted may grow to still fits it: the decoding batch
  pads its rows to the longest, so that is (requests held + 1) x the longest prompt + max_tokens
  among them, prompts being prefilled and parked rows counted as rows. A request alone is always
  admitted (the budget holds one window: the server refuses to start otherwise);
- background requests (judge decoding) are admitted, prefilled and decoded only while no
  served request is active, at most `max_background` at once (parked ones included); when a
  served request arrives, the background rows are parked (their long prompts would otherwise
  widen every served row's attention), and unparked once none is active;
- background jobs (judge scoring: one forward pass each) run one an iteration, so a request
  arriving meanwhile waits behind one at most; while served requests are active they still get
  `background_share` of the engine's time (after a job of d seconds, the next waits
  d * (1 - share) / share), so a server that is never idle still judges (with the judge
  deferred until idle, a busy eval server judged 8 turns of 532 in 45 minutes) and serving
  slows by at most share / (1 - share); weight swaps run at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clawrl.engine.base import SamplingParams, TokenEvent
from clawrl.engine.local.sampling import RowSampler
from clawrl.model import constrain


@dataclass(eq=False)
class Request:
    """One generation request, from arrival to its last token."""

    prompt_ids: list[int]
    params: SamplingParams
    sampler: RowSampler
    queue: asyncio.Queue[TokenEvent | BaseException] = field(default_factory=asyncio.Queue)
    generated: int = 0
    last_token: int = -1
    done: bool = False
    cancelled: bool = False
    cache: Any = None  # a long prompt's own KV cache while it is prefilled chunk by chunk
    prefilled: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    kv_version: str | None = None  # the version that computed this prompt's first KV
    cached_version: str | None = None  # an older version whose cached KV this prompt started from
    scaled: bool = False  # RoPE scaled for this whole sequence (clawrl/model/rope.py)
    constraint: constrain.Constraint | None = None  # its grammar's matcher (None: free decoding)

    @property
    def background(self) -> bool:
        return self.params.background


@dataclass(eq=False)
class Job:
    """Work run between two iterations in the engine's thread: a weight swap or a scoring call."""

    run: Callable[[], Any]
    future: asyncio.Future[Any]
    background: bool = False  # judge scoring: idle gaps and `background_share` of a busy engine
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0  # how long `run` took

    def settle(self) -> None:
        """Hand the result (or the error) to the caller awaiting it, if it still waits."""
        if self.future.done():  # the caller went away
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


# What `plan()` returns: a group to prefill, one long prompt's next chunk, "park" / "unpark"
# the background rows, or None (a decoding step of the running rows).
Work = list[Request] | Request | str | None


@dataclass
class Parked:
    """Background rows set aside with their KV (opaque here: the engine's cache and mask)."""

    rows: list[Request]
    cache: Any
    mask: Any


class Scheduler:
    """The engine's queues and the rules that pick each iteration's work (module docstring)."""

    def __init__(
        self,
        max_batch: int,
        prefill_budget: int,
        max_background: int,
        chunk: int,
        background_share: float = 0.15,
        kv_tokens: int | None = None,
    ) -> None:
        if not 0 < background_share <= 1:
            raise ValueError(f"background_share must be in (0, 1], not {background_share}")
        self.max_batch = max_batch
        self.prefill_budget = prefill_budget
        self.max_background = max_background
        self.chunk = chunk
        self.background_share = background_share
        self.kv_tokens = kv_tokens  # most padded KV positions the requests held may grow to; None: no bound
        self._background_due = 0.0  # while serving, the next background job waits until then
        self.waiting: deque[Request] = deque()
        self.chunking: list[Request] = []
        self.rows: list[Request] = []
        self.parked: Parked | None = None
        self.jobs: list[Job] = []
        self._prefilled_last = False  # after a prefill the running rows get a step before the next

    def plan(self) -> Work:
        """The next iteration's work (see `Work`)."""
        self.chunking = [r for r in self.chunking if not r.cancelled]
        served = self.serving()
        if served and any(r.background for r in self.rows):
            return "park"
        if not served and self.parked is not None:
            return "unpark"
        work: Work = None
        if not (self.rows and self._prefilled_last):
            work = self._admit() or self._next_chunk()
        self._prefilled_last = work is not None
        return work

    def take_jobs(self, now: float) -> list[Job]:
        """This iteration's jobs: every swap, and one background job if no served request is
        active or, while one is, if the background share allows it at `now` (monotonic seconds)."""
        background = [j for j in self.jobs if j.background]
        take = [j for j in self.jobs if not j.background]
        if background and (not self.serving() or now >= self._background_due):
            take.append(background[0])
        self.jobs = [j for j in self.jobs if j not in take]
        return take

    def ran(self, jobs: list[Job], now: float) -> None:
        """The jobs of an iteration ended at `now`: a background one sets when the next may run."""
        spent = sum(j.seconds for j in jobs if j.background)
        if spent:
            self._background_due = now + spent * (1 - self.background_share) / self.background_share

    def serving(self) -> bool:
        """Whether any served (not background) request is decoding, prefilling or waiting."""
        return any(not r.background and not r.cancelled for r in [*self.rows, *self.chunking, *self.waiting])

    def idle(self) -> bool:
        """Nothing to run: the loop may sleep until a request or a job arrives."""
        return not (self.rows or self.waiting or self.chunking or self.parked or self.jobs)

    def queued(self) -> int:
        """Requests not in the running batch: waiting, being prefilled, or parked."""
        return len(self.waiting) + len(self.chunking) + (len(self.parked.rows) if self.parked else 0)

    def everyone(self) -> list[Request]:
        """Every request the engine holds, in any queue."""
        parked = self.parked.rows if self.parked else []
        return [*self.rows, *self.chunking, *parked, *self.waiting]

    def fail(self, work: Work) -> list[Request]:
        """An iteration of `work` failed: the running rows and the requests it admitted are done
        (returned, to be told); the rest wait on."""
        admitted = work if isinstance(work, list) else [work] if isinstance(work, Request) else []
        failed = [*self.rows, *admitted]
        self.chunking = [r for r in self.chunking if r not in admitted]
        for req in failed:
            req.done = True
        self.rows = []
        return failed

    def clear(self) -> None:
        self.rows, self.waiting, self.chunking, self.parked = [], deque(), [], None

    def _next_chunk(self) -> Request | None:
        """A served long prompt first; a background one (a judge prompt) only while no served
        request is decoding, so its prefill, the costly part, uses idle time."""
        decoding = any(not r.background for r in self.rows)
        for req in self.chunking:  # served requests sort first
            if not req.background or not decoding:
                return req
        return None

    def _admit(self) -> list[Request]:
        """Waiting requests in order, while the batch has room and padded prompts fit the budget.
        A long prompt moves to `chunking` instead of the returned group."""
        admitted: list[Request] = []
        width = 0
        background = sum(r.background for r in [*self.rows, *self.chunking])
        while self.waiting and len(self.rows) + len(self.chunking) + len(admitted) < self.max_batch:
            served = any(not r.background for r in admitted)  # this group serves someone already
            req = self._next_waiting(background, served)
            if req is None:
                break
            long = len(req.prompt_ids) > self.chunk
            grown = max(width, len(req.prompt_ids))
            if not long and admitted and grown * (len(admitted) + 1) > self.prefill_budget:
                break
            if not req.cancelled and not self._kv_fits(admitted, req):
                break
            self.waiting.remove(req)
            if req.cancelled:
                continue
            background += req.background
            if long:  # prefilled chunk by chunk, between decoding steps; served prompts first
                self.chunking.append(req)
                self.chunking.sort(key=lambda r: r.background)
            else:
                admitted.append(req)
                width = grown
        return admitted

    def _kv_fits(self, admitted: list[Request], req: Request) -> bool:
        """Whether the KV of every request held, `req` added, fits `kv_tokens` at its largest: the
        rows padded to the longest prompt + max_tokens (the gateway keeps that within the window)."""
        if self.kv_tokens is None:
            return True
        parked = self.parked.rows if self.parked else []
        held = [*self.rows, *self.chunking, *parked, *admitted]
        if not held:
            return True
        longest = max(len(r.prompt_ids) + r.params.max_tokens for r in [*held, req])
        return longest * (len(held) + 1) <= self.kv_tokens

    def _next_waiting(self, background: int, served: bool) -> Request | None:
        """The first served (or cancelled) waiting request; else a background one, if allowed."""
        for req in self.waiting:
            if not req.background or req.cancelled:
                return req
        parked = len(self.parked.rows) if self.parked else 0
        if background + parked < self.max_background and not served and not self.serving():
            return self.waiting[0]
        return None
