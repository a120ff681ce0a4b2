"""The local engine: a PyTorch model served with continuous batching.

One asyncio task asks the scheduler (`clawrl/engine/local/schedule.py`: admission, chunked
prefill, parking the judge's rows, which jobs run) for each iteration's work, then runs it in
a worker thread (always the same one), so the event loop keeps serving HTTP while torch
computes: the jobs (scoring, `clawrl/engine/local/scoring.py`; weight swaps), then a prefill
of admitted requests, one chunk of a long prompt, or one decoding step of the running batch.

New requests therefore join the running batch between two decoding steps (their first token
goes out right after the prefill), and finished or cancelled ones leave before the next. A
weight swap runs at the same point, so in-flight requests carry on and the tokens after it
come from the new weights; each token records the version that produced it. (The KV cache of
in-flight requests was computed by the old weights; like PipelineRL, we keep it.)

RoPE past the trained window (`model.scale_rope = "past_window"`, the default): a request
whose prompt + max_tokens passes the window the model was trained on uses the scaled rotary
table for all its positions, every other one the model's own (`clawrl/model/rope.py`); the
choice goes out on the first token (`TokenEvent.rope_scaled`) to be recorded with the turn.

Prefix caching (`engine.prefix_cache_mb`, `prefix_kv.py`): a long prompt is looked up in the
`PrefixCache` before its first chunk; on a hit its KV starts as a view of the
cached prompt's and only the rest is prefilled. Each fully prefilled long
prompt is kept for later requests, unless a weight swap happened while it was
prefilled (its KV would then mix two versions). An entry is its user's alone (the request's
`SamplingParams.adapter`): another user's lookup never matches it, so `cached_tokens` counts only a
user's own reuse (prefix_cache.py). A swap keeps the entries
(`engine.prefix_cache_across_versions`, the default: a turn started from an older
version's KV records it) or, without it, empties the cache.

Grammars (`SamplingParams.grammar`, `engine.constrained_decoding`): a request decoded under one
gets an llguidance matcher (`clawrl/model/constrain.py`), compiled off the event loop before
it waits; each of its logits rows (prefill or step) is masked to the tokens the grammar allows
before sampling, and the matcher consumes the token drawn. The recorded logprob is then that
of the masked distribution. Under a grammar a stop token always ends the sequence (`ignore_eos`
included): once the grammar is complete, end of sequence is all it allows.

Versions (`serve_version`): the version's folder is read and checked in a worker
thread, outside the pause; then `swap_weights` merges it between two decoding
steps (`clawrl/engine/local/merge.py`). A folder that cannot be read or does not fit
the model raises `VersionRefused` with the weights untouched. With an adapter per user
(`per_user`, docs/users.md) the weights never change: each row of a forward gets its request's
user's adapter (`clawrl/engine/local/stack.py`), a user's version goes into that user's slot, and
each token records the version of its request's user (`version_of`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from typing import Any

import torch

from clawrl.engine.base import (
    EngineFailed,
    EngineStats,
    SamplingParams,
    TokenEvent,
    VersionRefused,
    WeightLoader,
)
from clawrl.engine.local.batch import DecodeBatch
from clawrl.engine.local.merge import VersionMerger
from clawrl.engine.local.penalties import Penalties
from clawrl.engine.local.prefix_cache import PrefixCache
from clawrl.engine.local.prefix_kv import keep_prefix, start_from_cache
from clawrl.engine.local.sampling import RowSampler, Sampled, sample_rows
from clawrl.engine.local.schedule import Job, Parked, Request, Scheduler, Work
from clawrl.engine.local.scoring import Scorer
from clawrl.engine.local.stack import AdapterStack
from clawrl.model import constrain, rope
from clawrl.model.heap import release_free_memory
from clawrl.model.sampling import CLAWRL_SAMPLING, SamplingDefaults
from clawrl.types import DEFAULT_USER, Version
from clawrl.version_folder import DEFAULT_TARGETS

log = logging.getLogger(__name__)


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
        background_share: float = 0.15,
        prefill_chunk: int = 256,
        prefix_cache: PrefixCache | None = None,
        version: str = "v0",
        lora_targets: tuple[str, ...] | list[str] = DEFAULT_TARGETS,
        merge_eagerly: bool = False,
        sampling_defaults: SamplingDefaults = CLAWRL_SAMPLING,
        constrained_decoding: bool = True,
        kv_tokens: int | None = None,
        per_user: bool = False,
        adapter_slots: int = 2,
        lora_rank: int = 16,
    ) -> None:
        self.model = model.eval()
        self.model_name = model_name
        self.max_context = max_context
        self.stop_token_ids = stop_token_ids
        self.version = version
        self.sampling_defaults = sampling_defaults
        self.constrained_decoding = constrained_decoding
        self.processed_logprobs = True  # of what it drew from: truncated, penalised (sampling.py)
        self.device = next(model.parameters()).device
        self.prefix_cache = prefix_cache
        self._queue = Scheduler(
            max_batch=max_batch_size,
            prefill_budget=max_prefill_tokens,
            max_background=max_background_rows,
            chunk=prefill_chunk,
            background_share=background_share,
            kv_tokens=kv_tokens,
        )
        self._batch = DecodeBatch(model, self.device)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # One thread for all torch work: OpenMP keeps a thread team per calling thread, and an
        # idle team spinning beside the busy one steals the cores (seen as 10-20% lost throughput).
        self._thread: ThreadPoolExecutor | None = None
        self._stats = EngineStats()
        # An adapter per user (docs/users.md): each row its user's adapter (stack.py); else one version
        # for every request, merged into the weights or on side paths (merge.py).
        # `adapter_slots` (the base's included) at `lora_rank` are preallocated (model/adapter_slots.py).
        stack = AdapterStack(self.model, lora_targets, adapter_slots, lora_rank) if per_user else None
        self._adapters = stack
        self._versions = self._adapters or VersionMerger(self.model, lora_targets)
        self._scorer = Scorer(self.model, self._versions, self.device)
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
        for req in self._queue.everyone():
            req.queue.put_nowait(EngineFailed("the server is shutting down"))
        self._queue.clear()
        if self._thread is not None:
            self._thread.shutdown(wait=True)  # let a running step finish before the batch is cleared
        self._batch.keep([])

    def stats(self) -> EngineStats:
        self._stats.active = len(self._queue.rows)
        self._stats.waiting = self._queue.queued()
        if self.prefix_cache is not None:
            self._stats.extra["prefix_cache"] = asdict(self.prefix_cache.stats)
        if self._adapters is not None:  # an adapter per user: whose versions, and what the stack holds
            self._stats.extra["adapters"] = {
                "served": dict(self._adapters.served),
                "bytes": self._adapters.bytes,
            }
        return self._stats

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        penalties = Penalties(params.repetition_penalty, params.frequency_penalty, params.presence_penalty)
        sampler = RowSampler.create(
            temperature=params.temperature,
            top_p=params.top_p,
            top_logprobs=params.top_logprobs,
            seed=params.seed,
            device=self.device,
            top_k=params.top_k,
            penalties=penalties,
            prompt_ids=prompt_ids,
        )
        req = Request(list(prompt_ids), params, sampler)
        if params.grammar is not None and self.constrained_decoding:
            req.constraint = await self._constraint(params.grammar)
        # A sequence that may pass the trained window is scaled from its first token (model/rope.py).
        req.scaled = self._rope is not None and len(prompt_ids) + params.max_tokens > self._rope.trained
        self._queue.waiting.append(req)
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
        score = self._scorer.score
        return await self._submit(lambda: score(prompt_ids, response_ids, temperature, base), background=True)

    async def next_token_logprobs(
        self, prompt_ids: list[int], token_ids: list[int], *, base: bool = False
    ) -> list[float]:
        next_token = self._scorer.next_token
        return await self._submit(lambda: next_token(prompt_ids, token_ids, base), background=True)

    def version_of(self, user: str) -> str:
        """The version `user`'s new requests get: their own with an adapter per user, else `version`."""
        if self._adapters is None or user == DEFAULT_USER:
            return self.version
        return self._adapters.served.get(user, "v0")

    async def serve_version(self, version: Version) -> None:
        loop = asyncio.get_running_loop()
        try:
            load = await loop.run_in_executor(None, self._versions.loader, version)
            if version.user == DEFAULT_USER:
                await self.swap_weights(load, version.name)  # checks shapes before changing a weight
            else:  # a user's own, in their slot (stack.py): the other users' rows and cache carry on
                await self._submit(lambda: load(self.model))
                log.info("now serving %s to %s", version.name, version.user)
        except (ValueError, KeyError, OSError) as exc:  # a broken checkpoint must not stop serving
            raise VersionRefused(f"cannot serve {version.name} from {version.path}: {exc}") from exc

    async def forget_user(self, user: str) -> None:
        """Forget what the engine keeps of `user` (their data was erased): their adapter (served v0 from
        now on) and their prefix-cache entries. Requests in flight finish on what they started with;
        a prompt prefilled meanwhile is not kept (its version is no longer the user's)."""

        def forget() -> None:
            if self._adapters is not None:
                self._adapters.apply(user, {})
                self._adapters.served.pop(user, None)
            if self.prefix_cache is not None:
                self.prefix_cache.drop_user(user)

        await self._submit(forget)
        log.info("forgot %s: served v0, nothing of theirs cached", user)

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
            # (across versions, the entries stay: see prefix_cache.py)

        await self._submit(swap)
        log.info("now serving %s", version)

    async def _submit(self, run: Callable[[], Any], background: bool = False) -> Any:
        job = Job(run, asyncio.get_running_loop().create_future(), background)
        self._queue.jobs.append(job)
        self._wake.set()
        return await job.future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            work = self._queue.plan()
            jobs = self._queue.take_jobs(time.monotonic())
            try:
                events = await loop.run_in_executor(self._thread, self._iterate, work, jobs)
            except Exception as exc:  # degrade on purpose: fail this batch, keep serving
                log.exception("decoding step failed")
                error = EngineFailed(f"the model failed while decoding: {exc}")
                self._batch.keep([])
                events = [(req, error) for req in self._queue.fail(work)]
            for req, event in events:
                req.queue.put_nowait(event)
            for job in jobs:
                job.settle()
            self._queue.ran(jobs, time.monotonic())
            if self._queue.idle():
                self._wake.clear()
                await loop.run_in_executor(self._thread, release_free_memory)

    # --- everything below runs in the worker thread -------------------------------

    def _iterate(self, work: Work, jobs: list[Job]) -> list[tuple[Request, TokenEvent]]:
        for job in jobs:
            start = time.perf_counter()
            try:
                job.result = job.run()
            except Exception as exc:  # handed to the caller awaiting the job
                job.error = exc
            job.seconds = time.perf_counter() - start
        if isinstance(work, list):
            return self._prefill(work)
        if work == "park":
            return self._park()
        if work == "unpark":
            return self._unpark()
        if work is not None:
            return self._prefill_chunk(work)
        self._retire()
        events: list[tuple[Request, TokenEvent]] = []
        rows = self._queue.rows
        if rows:
            with rope.rope_rows(self._rope, [r.scaled for r in rows]), self._rows(rows):
                logits = self._batch.step([r.last_token for r in rows])
            sampled = self._sample(logits, rows)
            events += [(req, self._emit(req, s)) for req, s in zip(rows, sampled, strict=True)]
            self._stats.steps += 1
            self._stats.batch_rows += len(sampled)
            self._retire()
        return events

    def _park(self) -> list[tuple[Request, TokenEvent]]:
        """Set the background rows aside, with their KV, while served requests decode."""
        self._retire()
        q = self._queue
        rows = [i for i, r in enumerate(q.rows) if r.background]
        if rows:
            cache, mask = self._batch.take(rows)
            q.parked = Parked([q.rows[i] for i in rows], cache, mask)
            q.rows = [r for r in q.rows if not r.background]
        return []

    def _unpark(self) -> list[tuple[Request, TokenEvent]]:
        q = self._queue
        assert q.parked is not None
        parked, q.parked = q.parked, None
        self._batch.join(parked.cache, parked.mask)
        q.rows += parked.rows
        self._retire()  # some may have been cancelled while parked
        return []

    def _prefill(self, admitted: list[Request]) -> list[tuple[Request, TokenEvent]]:
        self._retire()
        with rope.rope_rows(self._rope, [r.scaled for r in admitted]), self._rows(admitted):
            logits, cache, mask = self._batch.prefill([r.prompt_ids for r in admitted])
        sampled = self._sample(logits, admitted)
        events = [(req, self._emit(req, s)) for req, s in zip(admitted, sampled, strict=True)]
        self._batch.join(cache, mask)
        self._queue.rows += admitted
        self._retire()  # a request finished by its first token leaves at once
        return events

    def _prefill_chunk(self, req: Request) -> list[tuple[Request, TokenEvent]]:
        if req.kv_version is None:
            start_from_cache(self.prefix_cache, self._batch, req, self.version_of(req.params.adapter))
        start = req.prefilled
        # Background prompts go in quarter-size chunks: a served request arriving meanwhile waits less.
        chunk = self._queue.chunk
        size = max(16, chunk // 4) if req.background else chunk
        with rope.rope_rows(self._rope, [req.scaled]), self._rows([req]):
            logits, req.cache = self._batch.extend(req.cache, req.prompt_ids[start : start + size], start)
        req.prefilled = min(len(req.prompt_ids), start + size)
        if req.prefilled < len(req.prompt_ids):
            return []
        self._queue.chunking.remove(req)
        keep_prefix(self.prefix_cache, req, self.version_of(req.params.adapter))
        self._retire()
        event = self._emit(req, self._sample(logits[None], [req])[0])
        if not req.done:
            mask = torch.ones(1, len(req.prompt_ids), dtype=torch.long, device=self.device)
            self._batch.join(req.cache, mask)
            self._queue.rows.append(req)
        req.cache = None
        return [(req, event)]

    def _rows(self, reqs: list[Request]) -> AbstractContextManager[None]:
        """Each row of the next forward decoded with its user's adapter (an adapter per user)."""
        return (
            nullcontext() if self._adapters is None else self._adapters.rows([r.params.adapter for r in reqs])
        )

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[Sampled]:
        """One token per row of logits [B, V], each row masked by its grammar (if any) first."""
        constrain.mask_logits_(logits, [r.constraint for r in reqs])
        return sample_rows(logits, [r.sampler for r in reqs])

    def _emit(self, req: Request, s: Sampled) -> TokenEvent:
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
        version = self.version_of(req.params.adapter)
        return TokenEvent(
            token_id=s.token_id,
            logprob=s.logprob,
            version=version,
            top_logprobs=s.top,
            finish_reason=finish,
            cached_tokens=req.cached_tokens if first else 0,
            rope_scaled=scaled,
            cached_version=req.cached_version if first else None,
        )

    def _retire(self) -> None:
        rows = self._queue.rows
        keep = [i for i, r in enumerate(rows) if not (r.done or r.cancelled)]
        if len(keep) != len(rows):
            self._batch.keep(keep)
            self._queue.rows = [rows[i] for i in keep]
