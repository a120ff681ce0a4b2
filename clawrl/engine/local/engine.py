"""The local engine: a PyTorch model served with continuous batching.

One asyncio task owns the scheduler. Each iteration it takes the waiting
requests and queued jobs (scoring, weight swaps), then runs one *iteration* in a
worker thread (always the same one), so the event loop keeps serving HTTP while
torch computes:

    jobs (score / swap weights)  ->  either: prefill admitted requests together
                                     or:     one decode step of the running batch

New requests therefore join the running batch between two decoding steps (their
first token goes out right after the prefill, without waiting for a step), and
finished or cancelled ones leave before the next. Admission takes waiting
requests in order while their padded prompts fit `max_prefill_tokens`; a longer
prompt is prefilled alone. A weight swap runs at the
same point, so in-flight requests carry on and the tokens after it come from
the new weights; each token records the version that produced it. (The KV cache
of in-flight requests was computed by the old weights; like PipelineRL, we keep
it rather than recompute.)

RoPE past the trained window (`model.scale_rope = "past_window"`, the default): a request
whose prompt + max_tokens passes the window the model was trained on uses the scaled rotary
table for all its positions, every other one the model's own (`clawrl/engine/rope.py`); the
choice goes out on the first token (`TokenEvent.rope_scaled`) to be recorded with the turn.

Prefix caching (`engine.prefix_cache_mb`): a long prompt is looked up in the
`PrefixCache` before its first chunk; on a hit its KV starts as a view of the
cached prompt's and only the rest is prefilled. Each fully prefilled long
prompt is kept for later requests, unless a weight swap happened while it was
prefilled (its KV would then mix two versions). A swap empties the cache.

Grammars (`SamplingParams.grammar`, `engine.constrained_decoding`): a request decoded under one
gets an llguidance matcher (`clawrl/engine/constrain.py`), compiled off the event loop before
it waits; each of its logits rows (prefill or step) is masked to the tokens the grammar allows
before sampling, and the matcher consumes the token drawn. The recorded logprob is then that
of the masked distribution. Under a grammar a stop token always ends the sequence (`ignore_eos`
included): once the grammar is complete, end of sequence is all it allows.

Scoring jobs (`score`, `next_token_logprobs`: the judge's label likelihoods) are background
work, as judge decoding is: they run only while no served request is active, one an
iteration, so a request arriving in a gap waits behind one judge forward pass at most. Weight
swaps run at once.

Versions (`serve_version`): the version's folder is read and checked in a worker
thread, outside the pause; then `swap_weights` merges it between two decoding
steps (`clawrl/engine/local/merge.py`). A folder that cannot be read or does not fit
the model raises `VersionRefused` with the weights untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from clawrl.engine import constrain, rope
from clawrl.engine.base import (
    CLAWRL_SAMPLING,
    EngineFailed,
    EngineStats,
    SamplingDefaults,
    SamplingParams,
    TokenEvent,
    VersionRefused,
    WeightLoader,
)
from clawrl.engine.local.batch import DecodeBatch
from clawrl.engine.local.merge import VersionMerger
from clawrl.engine.local.penalties import Penalties
from clawrl.engine.local.prefix_cache import PrefixCache
from clawrl.engine.local.sampling import RowSampler, Sampled, sample_rows, score_tokens
from clawrl.engine.memory import release_free_memory
from clawrl.types import Version
from clawrl.version_folder import DEFAULT_TARGETS, AdapterError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
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
    scaled: bool = False  # RoPE scaled for this whole sequence (clawrl/engine/rope.py)
    constraint: constrain.Constraint | None = None  # its grammar's matcher (None: free decoding)


@dataclass(eq=False)
class _Job:
    run: Callable[[], Any]
    future: asyncio.Future[Any]
    background: bool = False  # judge work: run only while no served request is active
    result: Any = None
    error: BaseException | None = None


class LocalEngine:
    """Serve a causal LM from this process. See the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        model_name: str,
        max_context: int,
        stop_token_ids: frozenset[int],
        max_batch_size: int = 16,
        max_prefill_tokens: int = 4096,
        max_background_rows: int = 8,
        prefill_chunk: int = 256,
        prefix_cache: PrefixCache | None = None,
        version: str = "v0",
        lora_targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
        merge_eagerly: bool = False,
        sampling_defaults: SamplingDefaults = CLAWRL_SAMPLING,
        constrained_decoding: bool = True,
    ) -> None:
        self.model = model.eval()
        self.model_name = model_name
        self.max_context = max_context
        self.stop_token_ids = stop_token_ids
        self.version = version
        self.sampling_defaults = sampling_defaults
        self.constrained_decoding = constrained_decoding
        self.processed_logprobs = False  # log_softmax(logits / T), whatever top_p, top_k, penalties
        self.device = next(model.parameters()).device
        self._max_batch = max_batch_size
        self._prefill_budget = max_prefill_tokens
        self._max_background = max_background_rows
        self._chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self._chunking: list[_Request] = []  # long prompts, prefilled one chunk per iteration
        self._parked: tuple[list[_Request], Any, torch.Tensor] | None = None  # background rows set aside
        self._batch = DecodeBatch(model, self.device)
        self._rows: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._jobs: list[_Job] = []
        self._prefilled_last = False  # after a prefill the running rows get a step before the next one
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # One thread for all torch work: OpenMP keeps a thread team per calling thread, and an
        # idle team spinning beside the busy one steals the cores (seen as 10-20% lost throughput).
        self._thread: ThreadPoolExecutor | None = None
        self._stats = EngineStats()
        self._versions = VersionMerger(self.model, lora_targets)
        self._merge_eagerly = merge_eagerly  # a server that trains LoRA copies the base weights at start
        self._rope = rope.find(self.model)  # None: one RoPE for every sequence

    async def start(self) -> None:
        if self._merge_eagerly:
            await asyncio.get_running_loop().run_in_executor(None, self._versions.prepare)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clawrl-engine")
        self._task = asyncio.create_task(self._loop(), name="clawrl-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        parked = self._parked[0] if self._parked else []
        for req in [*self._rows, *self._chunking, *parked, *self._waiting]:
            req.queue.put_nowait(EngineFailed("the server is shutting down"))
        self._rows, self._waiting, self._chunking, self._parked = [], deque(), [], None
        if self._thread is not None:
            self._thread.shutdown(wait=True)  # let a running step finish before the batch is cleared
        self._batch.keep([])

    def stats(self) -> EngineStats:
        self._stats.active = len(self._rows)
        self._stats.waiting = (
            len(self._waiting) + len(self._chunking) + (len(self._parked[0]) if self._parked else 0)
        )
        if self.prefix_cache is not None:
            self._stats.extra["prefix_cache"] = asdict(self.prefix_cache.stats)
        return self._stats

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        penalties = Penalties(params.repetition_penalty, params.frequency_penalty, params.presence_penalty)
        sampler = RowSampler.create(
            params.temperature,
            params.top_p,
            params.top_logprobs,
            params.seed,
            self.device,
            params.top_k,
            penalties,
            prompt_ids,
        )
        req = _Request(list(prompt_ids), params, sampler)
        if params.grammar is not None and self.constrained_decoding:
            req.constraint = await self._constraint(params.grammar)
        # A sequence that may pass the trained window is scaled from its first token (engine/rope.py).
        req.scaled = self._rope is not None and len(prompt_ids) + params.max_tokens > self._rope.trained
        self._waiting.append(req)
        self._wake.set()
        try:
            while True:
                event = await req.queue.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not req.done:
                req.cancelled = True  # the loop drops it before the next step
                self._stats.requests_cancelled += 1

    async def _constraint(self, grammar: dict[str, Any]) -> constrain.Constraint:
        """Compile a grammar off the event loop (the tokenizer's first build takes ~0.5 s)."""
        loop = asyncio.get_running_loop()
        try:
            tokenizer = await loop.run_in_executor(None, constrain.tokenizer_of, self.model)
            return await loop.run_in_executor(None, constrain.Constraint, tokenizer, grammar)
        except ValueError as exc:
            raise EngineFailed(f"cannot decode under this grammar: {exc}") from exc

    async def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0, *, base: bool = False
    ) -> list[float]:
        return await self._submit(lambda: self._score(prompt_ids, response_ids, temperature, base), True)

    async def next_token_logprobs(
        self, prompt_ids: list[int], token_ids: list[int], *, base: bool = False
    ) -> list[float]:
        return await self._submit(lambda: self._next_token(prompt_ids, token_ids, base), True)

    async def serve_version(self, version: Version) -> None:
        loop = asyncio.get_running_loop()
        try:
            load = await loop.run_in_executor(None, self._versions.loader, version)
            await self.swap_weights(load, version.name)  # checks shapes before changing a weight
        except (ValueError, KeyError, OSError) as exc:  # a broken checkpoint must not stop serving
            raise VersionRefused(f"cannot serve {version.name} from {version.path}: {exc}") from exc

    def close(self) -> None:
        """Nothing outside the event loop to release: the model goes with the process."""

    async def swap_weights(self, load: WeightLoader, version: str) -> None:
        """Apply `load(model)` between two decoding steps and serve `version` from then on."""

        def swap() -> None:
            with torch.no_grad():
                load(self.model)
            self.version = version
            if self.prefix_cache is not None and not self.prefix_cache.across_versions:
                self.prefix_cache.clear()  # its entries can never match again: free them

        await self._submit(swap)
        log.info("now serving %s", version)

    async def _submit(self, run: Callable[[], Any], background: bool = False) -> Any:
        job = _Job(run, asyncio.get_running_loop().create_future(), background)
        self._jobs.append(job)
        self._wake.set()
        return await job.future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            work = self._plan()
            jobs = self._take_jobs()
            try:
                events = await loop.run_in_executor(self._thread, self._iterate, work, jobs)
            except Exception as exc:  # degrade on purpose: fail this batch, keep serving
                log.exception("decoding step failed")
                events = self._fail_all(work, exc)
            for req, event in events:
                req.queue.put_nowait(event)
            for job in jobs:
                _settle(job)
            if not (self._rows or self._waiting or self._chunking or self._parked or self._jobs):
                self._wake.clear()
                await loop.run_in_executor(self._thread, release_free_memory)

    def _take_jobs(self) -> list[_Job]:
        """The jobs for this iteration: every swap, and one background job (judge scoring) if no
        served request is active, so a request arriving meanwhile waits behind one at most."""
        background = [j for j in self._jobs if j.background]
        take = [j for j in self._jobs if not j.background]
        if background and not self._serving():
            take.append(background[0])
        self._jobs = [j for j in self._jobs if j not in take]
        return take

    def _plan(self) -> list[_Request] | _Request | str | None:
        """The next iteration: prefill a group (a list), a chunk of one long prompt (a request),
        "park" / "unpark" the background rows, or a decoding step (None).

        After any prefill work the running rows get a step, so arrivals never starve decoding.
        Background rows (judge calls) decode only while no served request is active: their long
        prompts would otherwise widen every served row's attention in the shared cache.
        """
        self._chunking = [r for r in self._chunking if not r.cancelled]
        served = self._serving()
        if served and any(r.params.background for r in self._rows):
            return "park"
        if not served and self._parked is not None:
            return "unpark"
        work: list[_Request] | _Request | None = None
        if not (self._rows and self._prefilled_last):
            work = self._admit() or self._next_chunk()
        self._prefilled_last = work is not None
        return work

    def _serving(self) -> bool:
        """Whether any served (not background) request is decoding, prefilling or waiting."""
        return any(
            not r.params.background and not r.cancelled
            for r in [*self._rows, *self._chunking, *self._waiting]
        )

    def _next_chunk(self) -> _Request | None:
        """A served long prompt first; a background one (a judge prompt) only while no served
        request is decoding, so its prefill, the costly part, uses idle time."""
        serving = any(not r.params.background for r in self._rows)
        for req in self._chunking:  # served requests sort first
            if not req.params.background or not serving:
                return req
        return None

    def _park(self) -> list[tuple[_Request, TokenEvent]]:
        self._retire()
        rows = [i for i, r in enumerate(self._rows) if r.params.background]
        if rows:
            cache, mask = self._batch.take(rows)
            self._parked = ([self._rows[i] for i in rows], cache, mask)
            self._rows = [r for i, r in enumerate(self._rows) if i not in set(rows)]
        return []

    def _unpark(self) -> list[tuple[_Request, TokenEvent]]:
        assert self._parked is not None
        reqs, cache, mask = self._parked
        self._parked = None
        self._batch.join(cache, mask)
        self._rows += reqs
        self._retire()  # some may have been cancelled while parked
        return []

    def _admit(self) -> list[_Request]:
        """Waiting requests in order, while the batch has room and padded prompts fit the budget.

        Background requests (judge calls) are admitted only while no served request is active,
        at most `max_background_rows` of them at once (parked ones included).
        """
        admitted: list[_Request] = []
        width = 0
        background = sum(r.params.background for r in [*self._rows, *self._chunking])
        while self._waiting and len(self._rows) + len(self._chunking) + len(admitted) < self._max_batch:
            req = self._next_waiting(background)
            if req is None:
                break
            long = len(req.prompt_ids) > self._chunk
            grown = max(width, len(req.prompt_ids))
            if not long and admitted and grown * (len(admitted) + 1) > self._prefill_budget:
                break
            self._waiting.remove(req)
            if req.cancelled:
                continue
            background += req.params.background
            if long:  # prefilled chunk by chunk, between decoding steps; served prompts first
                self._chunking.append(req)
                self._chunking.sort(key=lambda r: r.params.background)
            else:
                admitted.append(req)
                width = grown
        return admitted

    def _next_waiting(self, background: int) -> _Request | None:
        for req in self._waiting:
            if not req.params.background or req.cancelled:
                return req
        parked = len(self._parked[0]) if self._parked else 0
        if background + parked < self._max_background and not self._serving():
            return self._waiting[0]
        return None

    def _fail_all(
        self, work: list[_Request] | _Request | str | None, exc: Exception
    ) -> list[tuple[_Request, BaseException]]:
        admitted = work if isinstance(work, list) else [work] if isinstance(work, _Request) else []
        failed = [*self._rows, *admitted]
        self._chunking = [r for r in self._chunking if r not in admitted]
        for req in failed:
            req.done = True
        self._rows = []
        self._batch.keep([])
        error = EngineFailed(f"the model failed while decoding: {exc}")
        return [(req, error) for req in failed]

    # --- everything below runs in the worker thread -------------------------------

    def _iterate(
        self, work: list[_Request] | _Request | str | None, jobs: list[_Job]
    ) -> list[tuple[_Request, TokenEvent]]:
        for job in jobs:
            try:
                job.result = job.run()
            except Exception as exc:  # handed to the caller awaiting the job
                job.error = exc
        if isinstance(work, list):
            return self._prefill(work)
        if work == "park":
            return self._park()
        if work == "unpark":
            return self._unpark()
        if work is not None:
            return self._prefill_chunk(work)
        self._retire()
        events: list[tuple[_Request, TokenEvent]] = []
        if self._rows:
            with rope.rope_rows(self._rope, [r.scaled for r in self._rows]):
                logits = self._batch.step([r.last_token for r in self._rows])
            sampled = self._sample(logits, self._rows)
            events += [(req, self._emit(req, s)) for req, s in zip(self._rows, sampled, strict=True)]
            self._stats.steps += 1
            self._stats.batch_rows += len(sampled)
            self._retire()
        return events

    def _prefill(self, admitted: list[_Request]) -> list[tuple[_Request, TokenEvent]]:
        self._retire()
        with rope.rope_rows(self._rope, [r.scaled for r in admitted]):
            logits, cache, mask = self._batch.prefill([r.prompt_ids for r in admitted])
        sampled = self._sample(logits, admitted)
        events = [(req, self._emit(req, s)) for req, s in zip(admitted, sampled, strict=True)]
        self._batch.join(cache, mask)
        self._rows += admitted
        self._retire()  # a request finished by its first token leaves at once
        return events

    def _prefill_chunk(self, req: _Request) -> list[tuple[_Request, TokenEvent]]:
        if req.kv_version is None:
            self._start_from_cache(req)
        start = req.prefilled
        # Background prompts go in quarter-size chunks: a served request arriving meanwhile waits less.
        size = max(16, self._chunk // 4) if req.params.background else self._chunk
        with rope.rope_rows(self._rope, [req.scaled]):
            logits, req.cache = self._batch.extend(req.cache, req.prompt_ids[start : start + size], start)
        req.prefilled = min(len(req.prompt_ids), start + size)
        if req.prefilled < len(req.prompt_ids):
            return []
        self._chunking.remove(req)
        self._keep_prefix(req)
        self._retire()
        event = self._emit(req, self._sample(logits[None], [req])[0])
        if not req.done:
            mask = torch.ones(1, len(req.prompt_ids), dtype=torch.long, device=self.device)
            self._batch.join(req.cache, mask)
            self._rows.append(req)
        req.cache = None
        return [(req, event)]

    def _start_from_cache(self, req: _Request) -> None:
        """Before a long prompt's first chunk: start its KV from the longest cached prefix.

        Entries are salted by version, so a prompt never starts from another version's KV
        (unless `across_versions` allows it)."""
        req.kv_version = self.version
        if self.prefix_cache is None:
            return
        hit, kv = self.prefix_cache.lookup(req.prompt_ids, self.version, _rope_key(req))
        if kv is not None:
            req.cache, req.prefilled, req.cached_tokens = self._batch.cache_of(kv), hit, hit

    def _keep_prefix(self, req: _Request) -> None:
        """After a long prompt's last chunk: keep its KV, if one version computed all of it."""
        if self.prefix_cache is None or req.kv_version != self.version:
            return
        kv = [(layer.keys, layer.values) for layer in req.cache.layers]
        self.prefix_cache.insert(req.prompt_ids, kv, self.version, _rope_key(req))

    def _sample(self, logits: torch.Tensor, reqs: list[_Request]) -> list[Sampled]:
        """One token per row of logits [B, V], each row masked by its grammar (if any) first."""
        constrain.mask_logits_(logits, [r.constraint for r in reqs])
        return sample_rows(logits, [r.sampler for r in reqs])

    def _emit(self, req: _Request, s: Sampled) -> TokenEvent:
        req.generated += 1
        req.last_token = s.token_id
        self._stats.tokens_generated += 1
        if req.constraint is not None and not req.constraint.advance(s.token_id):
            log.warning("a sampled token broke its grammar; the matcher now allows end of sequence only")
        finish = None
        stops = not req.params.ignore_eos or req.constraint is not None  # a grammar ends at its end
        if s.token_id in req.params.stop_token_ids and stops:
            finish = "stop"
        elif (
            req.generated >= req.params.max_tokens or len(req.prompt_ids) + req.generated >= self.max_context
        ):
            finish = "length"
        if finish is not None:
            req.done = True
            self._stats.requests_finished += 1
        first = req.generated == 1
        scaled = req.scaled if first else None
        return TokenEvent(
            s.token_id, s.logprob, self.version, s.top, finish, req.cached_tokens if first else 0, scaled
        )

    def _retire(self) -> None:
        keep = [i for i, r in enumerate(self._rows) if not (r.done or r.cancelled)]
        if len(keep) != len(self._rows):
            self._batch.keep(keep)
            self._rows = [self._rows[i] for i in keep]

    @torch.inference_mode()
    def _score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float, base: bool
    ) -> list[float]:
        if not prompt_ids or not response_ids:
            raise ValueError("score needs a non-empty prompt and response")
        logits = self._logits(prompt_ids + response_ids, len(response_ids) + 1, base)[:-1]
        targets = torch.tensor(response_ids, device=self.device)
        return score_tokens(logits, targets, temperature).tolist()

    @torch.inference_mode()
    def _next_token(self, prompt_ids: list[int], token_ids: list[int], base: bool) -> list[float]:
        if not prompt_ids or not token_ids:
            raise ValueError("next_token_logprobs needs a non-empty prompt and tokens")
        logprobs = torch.log_softmax(self._logits(prompt_ids, 1, base)[-1].float(), dim=-1)
        return logprobs[torch.tensor(token_ids, device=self.device)].tolist()

    def _logits(self, ids: list[int], keep: int, base: bool) -> torch.Tensor:
        """The last `keep` positions' logits [keep, V] of one sequence, on the served weights or
        the base ones: the live model run with the base copies of the weights a version changed
        (none while v0 is served), so judging on frozen weights costs no second model."""
        kwargs = {"input_ids": torch.tensor([ids], device=self.device), "logits_to_keep": keep}
        try:
            with self._versions.on_base(self.device) if base else nullcontext({}) as frozen:
                if frozen:
                    output = torch.func.functional_call(self.model, frozen, (), kwargs, strict=False)
                else:
                    output = self.model(**kwargs)
        except AdapterError as exc:  # a full version was served: the base weights are gone
            raise EngineFailed(f"cannot score on the base weights: {exc}") from exc
        return output.logits[0]


def _rope_key(req: _Request) -> str:
    """The prefix cache keeps scaled and unscaled KV apart: they never match each other."""
    return "scaled" if req.scaled else "own"


def _settle(job: _Job) -> None:
    if job.future.done():  # the caller went away
        return
    if job.error is not None:
        job.future.set_exception(job.error)
    else:
        job.future.set_result(job.result)
