"""Every replica serves the same versions: loaded on all the live ones before any serves it.

A LoRA version is loaded on every live replica first (`VLLMEngine.prepare`: the adapter is in
vLLM, no request names it yet); once all have it, every replica adopts it in one step of the event
loop (`VLLMEngine.adopt`, no await in between), and only then is it announced: `ReplicaEngine.version`,
`/healthz`, the version new turns record. A replica that refuses the version (`VersionRefused`)
refuses it for the set: nothing changes anywhere (its adapter stays loaded, unused, on the replicas
that loaded it). A full-weight version is reloaded in place on each live replica (reload.py), each
replica's tokens recording the version its own weights are, and announced once all have it; a
refusal on one puts the others back on the version served before.

A replica that is down when a version is announced, or fails while loading it, is marked behind
(`Replica.synced` false) and gets no request until it has served every announced version again
(`catch_up`, run by the engine once the replica's `/health` answers; one that fails is tried
again `CATCH_UP_RETRY_S` later, the replica out of routing meanwhile). One lock orders
announcements, catch-ups and erasures, so a replica never catches up to a version older than one
announced meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from clawrl.engine.base import EngineError
from clawrl.engine.replicas.replica import Replica
from clawrl.engine.vllm.engine import VLLMDown
from clawrl.types import DEFAULT_USER, Version

log = logging.getLogger(__name__)
BASE = Version(name="v0", step=0)  # the base model: what a rollback of full weights goes back to
CATCH_UP_RETRY_S = 10  # a replica that failed to catch up (a refusal, a load that failed) waits this long


class Versions:
    def __init__(self, replicas: list[Replica], *, full_weights: bool) -> None:
        self.replicas = replicas
        self.full_weights = full_weights
        self.served: dict[str, Version] = {}  # per user, the version announced ("default": everyone's)
        self._lock = asyncio.Lock()

    @property
    def announced(self) -> str:
        served = self.served.get(DEFAULT_USER)
        return served.name if served is not None else "v0"

    async def serve(self, version: Version) -> None:
        """Load `version` on every live replica, then announce it (the module docstring)."""
        async with self._lock:
            live = self._live()
            if self.full_weights:
                done = await self._reload(version, live)
            else:
                done = await self._load(version, live)
            self.served[version.user] = version
            log.info("announced %s: served by %d of %d vLLM replicas", version.name, done, len(self.replicas))

    def _live(self) -> list[Replica]:
        """The replicas to load a version on; the others are marked behind."""
        live = [r for r in self.replicas if r.live]
        for replica in self.replicas:
            if replica not in live:
                replica.synced = False
        if not live:
            raise VLLMDown("no vLLM replica is up to load the version on")  # the watcher tries again
        return live

    async def _load(self, version: Version, live: list[Replica]) -> int:
        results = await asyncio.gather(*(r.engine.prepare(version) for r in live), return_exceptions=True)
        loaded = [(r, name) for r, name in self._kept(live, results) if isinstance(name, str)]
        for replica, name in loaded:  # no await in this loop: the set switches in one step
            replica.engine.adopt(version, name)
        await asyncio.gather(*(r.engine.unload_retired() for r, _ in loaded))
        return len(loaded)

    async def _reload(self, version: Version, live: list[Replica]) -> int:
        loads = (r.engine.serve_version(version) for r in live)
        results = await asyncio.gather(*loads, return_exceptions=True)
        try:
            return len(self._kept(live, results))
        except EngineError:
            done = [r for r, result in zip(live, results, strict=True) if result is None]
            before = self.served.get(DEFAULT_USER, BASE)
            backs = (r.engine.serve_version(before) for r in done)
            back = await asyncio.gather(*backs, return_exceptions=True)
            for replica, result in zip(done, back, strict=True):
                if isinstance(result, BaseException):  # still on the refused version: catches up later
                    replica.synced = False
            raise

    def _kept(self, live: Sequence[Replica], results: Sequence[object]) -> list[tuple[Replica, object]]:
        """The replicas that loaded it, with their results. One that failed (`VLLMDown`) is marked
        behind; any other error (a refusal) is raised: the version is served nowhere."""
        kept = []
        for replica, result in zip(live, results, strict=True):
            if isinstance(result, VLLMDown):
                replica.synced = False
                replica.engine.server.suspect(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                kept.append((replica, result))
        if not kept:
            raise VLLMDown("every vLLM replica failed while loading the version")
        return kept

    async def catch_up(self, replica: Replica) -> None:
        """Serve `replica` every announced version (everyone's first); then it takes requests again."""
        async with self._lock:
            try:
                for version in sorted(self.served.values(), key=lambda v: v.user != DEFAULT_USER):
                    await replica.engine.serve_version(version)
            except EngineError as exc:
                replica.next_catch_up = time.monotonic() + CATCH_UP_RETRY_S
                log.warning("the vLLM replica at %s is behind and could not catch up (again in %d s): %s",
                            replica.url, CATCH_UP_RETRY_S, exc)  # fmt: skip
                return
            replica.synced = True
            log.info("the vLLM replica at %s serves every announced version again", replica.url)

    async def forget(self, user: str) -> None:
        """`user`'s data was erased: every replica serves them the base and salts them anew."""
        async with self._lock:
            self.served.pop(user, None)
            await asyncio.gather(*(r.engine.forget_user(user) for r in self.replicas))
