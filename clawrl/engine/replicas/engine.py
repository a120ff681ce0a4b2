"""A replica set: one gateway in front of several vLLM servers (`engine.vllm.urls`).

Each replica is a whole `VLLMEngine` with its own server (attached, or started and supervised by
clawrl); this engine routes each request to one of them and keeps them serving the same versions.

- **Routing** (`routing.py`, pure): a session's requests go to its replica (rendezvous hashing on
  the session, the user's name for a request with no session), so its prompt's prefix stays in that
  replica's cache, unless that replica is well above the mean load; requests with no key go to the
  least busy replica.
- **Versions** (`versions.py`): a version is loaded on every live replica before any serves it;
  only then is it announced (`version`, `/healthz`, new turns). A replica that is down at an
  announcement is left out of routing until it has loaded every announced version again.
- **Failover.** A replica that fails a request (`VLLMDown`: no answer, a dropped stream, a 5xx) is
  counted down until its `/health` answers again (a started one is restarted by its supervisor), and
  the request goes on at the next replica in its line: before the first token, it is sent again as
  it was; after tokens were streamed, it is resumed: the prompt and the tokens already sent go to the
  next replica as the prompt, for the tokens still allowed, so the client's stream carries on where
  it stopped. Each token is still sampled from the same version's distribution given everything
  before it, so the turn stays a faithful record (its `sampling["replicas"]` names both servers).
  One deviation: vLLM counts the presence and frequency penalties on the answer's own tokens, so on
  the resumed part the tokens sent before it count for the repetition penalty (as prompt tokens)
  but not for those two; such a turn's logprobs are of the penalised, "processed" kind anyway,
  which the trainer never takes a ratio to (engine/base.py `sampling_record`). An answer decoded
  under a grammar is not resumed: vLLM's structured outputs would start the grammar over at the
  resumed prompt, so it ends with an error in its stream, as on one server. A refused request
  (`VLLMRefused`, a 4xx) is the request's fault and fails at once. A client that hangs up cancels
  the request where it runs.
- **Recording.** The first token each replica decodes carries its URL (`TokenEvent.replica`); the
  turn records them in order (`Turn.sampling["replicas"]`).

Judge calls (`score`, `next_token_logprobs`) go to the least busy replica and move the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

from clawrl.engine.base import EngineFailed, EngineStats, SamplingParams, TokenEvent
from clawrl.engine.replicas.replica import Replica
from clawrl.engine.replicas.routing import affinity_key, route
from clawrl.engine.replicas.versions import Versions
from clawrl.engine.vllm.engine import VLLMDown, VLLMEngine
from clawrl.types import DEFAULT_USER, Version

log = logging.getLogger(__name__)
T = TypeVar("T")


def resumable(params: SamplingParams, made: int) -> bool:
    """Whether a request that streamed `made` tokens can be finished on another replica (above)."""
    return params.grammar is None and made < params.max_tokens


async def while_up(replica: Replica, events: AsyncIterator[T], poll_s: float) -> AsyncIterator[T]:
    """`events`, ended by `VLLMDown` once `replica` counts as down while one is awaited: a server
    that hangs (a frozen process, a machine cut off) never closes its streams, but its `/health`
    stops answering, and its supervisor marks it down (server.py)."""
    while True:
        step = asyncio.ensure_future(anext(events))
        try:
            while not step.done():
                await asyncio.wait([step], timeout=poll_s)
                if not step.done() and not replica.engine.server.up:
                    raise VLLMDown(f"the vLLM server at {replica.url} stopped answering mid-request")
        finally:
            if not step.done():  # the request's read is abandoned, and its generator let go of
                step.cancel()
                await asyncio.wait([step])
        try:
            event = step.result()
        except StopAsyncIteration:
            return
        yield event


class ReplicaEngine:
    """The Engine over several vLLM replicas (the module docstring)."""

    processed_logprobs = True  # each replica's (--logprobs-mode processed_logprobs)

    def __init__(self, engines: list[VLLMEngine], *, poll_s: float) -> None:
        first = engines[0]
        self.replicas = [Replica(e) for e in engines]
        self.model_name = first.model_name
        self.max_context = first.max_context
        self.stop_token_ids = first.stop_token_ids
        self.sampling_defaults = first.sampling_defaults
        self.constrained_decoding = first.constrained_decoding
        self.versions = Versions(self.replicas, full_weights=first.full_weights)
        self._poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._stats = EngineStats()

    @property
    def version(self) -> str:
        """The version announced: on every live replica."""
        return self.versions.announced

    async def start(self) -> None:
        await asyncio.gather(*(r.engine.start() for r in self.replicas))
        self.max_context = min(r.engine.max_context for r in self.replicas)
        self._task = asyncio.create_task(self._keep_up(), name="clawrl-replicas")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(r.engine.stop() for r in self.replicas))

    def close(self) -> None:
        for r in self.replicas:
            r.engine.close()

    async def _keep_up(self) -> None:
        """Bring each replica that missed a version back into step once it answers again."""
        while True:
            await asyncio.sleep(self._poll_s)
            for replica in self.replicas:
                due = time.monotonic() >= replica.next_catch_up
                if not replica.synced and replica.engine.server.up and due:
                    await self.versions.catch_up(replica)

    def version_of(self, user: str) -> str:
        live = [r for r in self.replicas if r.live] or self.replicas
        return live[0].engine.version_of(user)

    async def serve_version(self, version: Version) -> None:
        await self.versions.serve(version)

    async def forget_user(self, user: str) -> None:
        await self.versions.forget(user)

    def _next(self, key: str | None, tried: list[Replica]) -> Replica | None:
        """The replica a request tries next: the first of its line among the live ones not tried."""
        live = {r.url: r for r in self.replicas if r.live and r not in tried}
        line = route(key, list(live), {url: r.inflight for url, r in live.items()})
        return live[line[0]] if line else None

    def _failed(self, replica: Replica, exc: VLLMDown, errors: list[str]) -> None:
        replica.moved += 1
        replica.engine.server.suspect(str(exc))
        errors.append(f"{replica.url}: {exc}")

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        key = affinity_key(params.affinity, params.adapter, DEFAULT_USER)
        made: list[int] = []
        tried: list[Replica] = []
        errors: list[str] = []
        while (replica := self._next(key, tried)) is not None:
            tried.append(replica)
            try:
                async with aclosing(self._decode(replica, prompt_ids, made, params)) as events:
                    async for event in events:
                        made.append(event.token_id)
                        yield event
                return
            except VLLMDown as exc:
                self._failed(replica, exc, errors)
                if made and not resumable(params, len(made)):
                    raise EngineFailed(f"the replica at {replica.url} failed mid-answer: {exc}") from exc
                log.warning("%s failed a request after %d tokens; it goes on at the next replica: %s",
                            replica.url, len(made), exc)  # fmt: skip
        self._stats.extra["failed"] = self._stats.extra.get("failed", 0) + 1
        raise EngineFailed("no vLLM replica could serve the request: " + ("; ".join(errors) or "none is up"))

    async def _decode(
        self, replica: Replica, prompt_ids: list[int], made: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """One replica's part of the answer: all of it, or the rest after the `made` tokens."""
        if made:
            params = dataclasses.replace(params, max_tokens=params.max_tokens - len(made))
        first, finished = True, False
        replica.inflight += 1
        try:
            async with aclosing(replica.engine.generate(prompt_ids + made, params)) as events:
                async for event in while_up(replica, events, self._poll_s):
                    if first:  # a resumed part's cache counts and RoPE flag were the first part's
                        more = {"cached_tokens": 0, "rope_scaled": None} if made else {}
                        event = dataclasses.replace(event, replica=replica.url, **more)
                        first = False
                    finished = event.finish_reason is not None
                    yield event
            if not finished:
                raise VLLMDown(f"the vLLM server at {replica.url} ended the stream without finishing")
            replica.answered += 1
        finally:
            replica.inflight -= 1

    async def _any(self, call: Callable[[VLLMEngine], Awaitable[T]]) -> T:
        """A judge call on the least busy replica, moved to the next if that one fails."""
        tried: list[Replica] = []
        errors: list[str] = []
        while (replica := self._next(None, tried)) is not None:
            tried.append(replica)
            replica.inflight += 1
            try:
                return await call(replica.engine)
            except VLLMDown as exc:
                self._failed(replica, exc, errors)
            finally:
                replica.inflight -= 1
        raise EngineFailed("no vLLM replica could serve the call: " + ("; ".join(errors) or "none is up"))

    async def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0, *, base: bool = False
    ) -> list[float]:
        return await self._any(lambda e: e.score(prompt_ids, response_ids, temperature, base=base))

    async def next_token_logprobs(
        self, prompt_ids: list[int], token_ids: list[int], *, base: bool = False
    ) -> list[float]:
        return await self._any(lambda e: e.next_token_logprobs(prompt_ids, token_ids, base=base))

    def stats(self) -> EngineStats:
        s = self._stats
        parts = [r.engine.stats() for r in self.replicas]
        s.active = sum(r.inflight for r in self.replicas)
        s.tokens_generated = sum(p.tokens_generated for p in parts)
        s.requests_finished = sum(r.answered for r in self.replicas)
        s.requests_cancelled = sum(p.requests_cancelled for p in parts)
        live = [r for r in self.replicas if r.live]
        s.status = "ok" if live else "down"
        shown = live[0] if live else self.replicas[0]
        s.extra = {
            "failed": s.extra.get("failed", 0),  # requests no replica could finish
            "replicas": [r.report() for r in self.replicas],
            "vllm": shown.engine.server.report(),  # one replica's, where a single server's is read
            "model": shown.engine.stats().extra.get("model"),
        }
        return s
