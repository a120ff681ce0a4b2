"""Serving the latest published version: the server side of hot swaps, the same for every engine.

The trainer publishes a version by writing `checkpoints/vN/` (the version-folder
format, `clawrl/version_folder.py`) and then a row in the store's `versions` table.
A `VersionWatcher` in the server polls that table; when the latest version differs
from what the engine serves, it asks the engine to serve it (`Engine.serve_version`:
the local engine reads the folder outside its pause and merges it between two
decoding steps; the vLLM engine loads it into the vLLM server as a LoRA adapter).
Requests in flight carry on, and each token records the version that made it.

A version the engine refuses (`VersionRefused`: a folder missing, truncated or
garbled, weights of another shape, a LoRA rank above vLLM's limit, full weights on
vLLM) is logged once and passed over, never retried: the server serves the newest
version newer than its own that loads, so a server started on a run whose latest
checkpoint is broken serves the last good one, and a broken version published while
serving leaves the weights as they are. One the engine cannot try now (`EngineFailed`:
the vLLM server is down) is tried again at the next poll.

A version the canary gate held (`Version.held`, see `clawrl.guard`) is never
served: the watcher passes over it as over a broken one, and a server started
on a run whose latest version is held serves the newest one that is not.

With an adapter per user (`train.adapters`, docs/users.md; the watcher is given the users served) it
follows each user's line on its own: one read of every user's newest version a poll
(`Store.latest_versions`), then, for a user whose newest is not what the engine serves them
(`Engine.version_of`), that user's newest servable version, as above. A held or broken version of
one user leaves that user on their last good one and changes nothing for the others. A user removed
from the users file is not in `users`: their versions are no longer served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawrl.engine.base import Engine, EngineFailed, VersionRefused
from clawrl.store.db import Store
from clawrl.types import DEFAULT_USER, Version
from clawrl.version_folder import version_number

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldVersion:
    """A version the canary gate held, and why."""

    version: str
    reason: str


@dataclass(frozen=True)
class CanaryCheck:
    """The canary gate's figures for one version (None: not measured, or not recorded)."""

    version: str
    status: str  # the version's: passed | held | unchecked
    score: float | None = None
    base_score: float | None = None
    drop: float | None = None
    accuracy: float | None = None
    base_accuracy: float | None = None
    accuracy_drop: float | None = None
    kl: float | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class GuardHealth:
    """The canary gate as the server sees it (`guard` on /healthz, after the gate's limits)."""

    held_versions: int  # versions held, of all published
    last_held: HeldVersion | None
    last_check: CanaryCheck | None  # the newest version the gate checked


class VersionWatcher:
    def __init__(
        self,
        engine: Engine,
        store: Store,
        db: Any,
        poll_s: float,
        on_swap: Callable[[str, float], None] | None = None,
        users: frozenset[str] | None = None,
    ) -> None:
        self.engine, self.store, self.db = engine, store, db
        self.users = users  # an adapter per user: whose lines are followed; None: the one policy's
        self._poll = poll_s
        self._on_swap = on_swap  # told each swap's version and seconds (the metrics)
        self._failed: set[str] = set()  # versions passed over: held, or could not be loaded (logged once)
        self._task: asyncio.Task[None] | None = None
        self._held: dict[str, list[Version]] = {}  # each user's held versions, oldest first (last listing)
        self._checked: Version | None = None  # the newest version the canary gate checked

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="clawrl-version-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            if self.users is None:
                latest: Version = await self.db(self.store.latest_version)
                newest = {DEFAULT_USER: latest.name}
            else:
                newest = await self.db(self.store.latest_versions)
            for user in sorted(newest.keys() & (self.users or {DEFAULT_USER})):
                name = newest[user]
                if name != self.engine.version_of(user) and name not in self._failed:
                    await self._follow(user)
            await asyncio.sleep(self._poll)

    async def _follow(self, user: str) -> None:
        versions = await self.db(self.store.versions, user)
        self._held[user] = [v for v in versions if v.held]
        checked = next((v for v in reversed(versions) if v.canary), None)
        if checked is not None and (self._checked is None or checked.created_at >= self._checked.created_at):
            self._checked = checked
        await self._serve_newest(versions, user)

    async def _serve_newest(self, versions: list[Version], user: str = DEFAULT_USER) -> None:
        """Serve the newest version that loads, among those newer than the one `user` is served."""
        served = version_number(self.engine.version_of(user))
        for version in reversed(versions):
            if version.number <= served:
                return
            if version.held and version.name not in self._failed:
                log.warning("not serving %s: the canary gate held it (%s)", version.name, _why(version))
                self._failed.add(version.name)
            if version.name not in self._failed and await self.serve(version):
                return

    def forget(self, user: str) -> None:
        """`user`'s line was erased (docs/users.md): what was passed over or held on it is forgotten,
        so their new line, numbered from v1 again, is judged afresh."""
        self._failed = {name for name in self._failed if not name.startswith(f"{user}/")}
        self._held.pop(user, None)

    async def serve(self, version: Version) -> bool:
        """Have the engine serve `version`; False (logged) if it refuses it."""
        start = time.perf_counter()
        try:
            await self.engine.serve_version(version)
        except VersionRefused as exc:  # a broken or unservable version must not stop serving
            log.error("passing over %s: %s", version.name, exc)
            self._failed.add(version.name)
            return False
        except EngineFailed as exc:  # the server is down or restarting: try again at the next poll
            log.warning("cannot serve %s now: %s", version.name, exc)
            return True  # stop looking at older versions this round
        if self._on_swap is not None:
            self._on_swap(version.name, time.perf_counter() - start)
        return True

    def guard(self) -> GuardHealth:
        """The canary gate as the server sees it, for `/healthz`."""
        held = sorted((v for line in self._held.values() for v in line), key=lambda v: v.created_at)
        last = held[-1] if held else None
        return GuardHealth(
            held_versions=len(held),
            last_held=None if last is None else HeldVersion(last.name, _why(last)),
            last_check=None if self._checked is None else _check(self._checked),
        )


def _why(version: Version) -> str:
    return str((version.canary or {}).get("reason") or "no reason recorded")


_FIGURES = ("score", "base_score", "drop", "accuracy", "base_accuracy", "accuracy_drop", "kl", "seconds")


def _check(version: Version) -> CanaryCheck:
    c = version.canary or {}
    return CanaryCheck(version.name, version.status, **{k: c.get(k) for k in _FIGURES})
