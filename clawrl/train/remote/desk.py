"""The gateway's side of a remote trainer: `TrainerDesk`, a service of `clawrl serve` run with
`train.enabled = false` (no trainer of its own), behind the admin-key routes of `clawrl/api/trainer.py`.

- Every request names its trainer (`X-Clawrl-Trainer`) and renews its lease (lease.py); a request
  from another trainer while the lease is alive is refused (`TrainerBusy`): one trainer a store.
  While a remote trainer trains, the desk holds the run folder's `trainer.lock` for it, so a trainer
  started on the gateway's host is refused (exit 3), and a remote one while a local one trains.
- A store call (`wire.CALLS`, nothing else) runs on the store's one thread, as the server's own.
- Every `lease_s / 4` seconds the lease is looked at; one that ran out hands every claimed sample
  back (`Store.release_samples`: `ready`, or `superseded` if judged again meanwhile). A trainer
  that comes back after that publishes still: its samples were `ready` and nobody claimed them.
- A version arrives as a tar stream whose sha256 was checked already (folders.py: `Incoming`).
  Under the publish lock of the gateway's run folder: the name must be the line's next one
  (`PublishConflict` otherwise: a rollback was published meanwhile), the files are written as
  the trainer writes a version (hidden, fsynced, renamed), and the row is published with the
  samples marked `trained`, as `TrainLoop` does; a row the store refuses sets the folder aside.
  Then the line is pruned by the gateway's own `train.keep_versions` and `train.keep_every`.
- A version's folder is sent back the same way (a trainer that starts with an empty run folder).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from clawrl.config.training import TrainConfig
from clawrl.store.errors import StoreError
from clawrl.store.locks import TRAINER_LOCK, FolderLocked, hold
from clawrl.train.checkpoints import claim_next, publish_lock, set_aside, write_folder
from clawrl.train.prune import choose, prune
from clawrl.train.remote.errors import NoFolder, PublishConflict, TrainerBusy, UploadRefused
from clawrl.train.remote.folders import Packed, pack, unpack
from clawrl.train.remote.lease import UNKNOWN, Lease
from clawrl.train.remote.wire import CALLS, version_of
from clawrl.types import Version
from clawrl.version_folder import CHECKPOINTS, MANIFEST, version_dir, version_name, version_user

log = logging.getLogger(__name__)
Db = Callable[..., Awaitable[Any]]  # a call on the store's thread (Collector.db)


class TrainerDesk:
    def __init__(
        self,
        store: Any,
        db: Db,
        run_dir: Path,
        *,
        train: TrainConfig,
        per_user: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.db, self.run_dir, self.cfg = store, db, Path(run_dir), train
        self.per_user = per_user  # an adapter per user: "served" is the user's own (pruning)
        self.clock = clock
        # Claims found at start belong to a trainer from before the restart: theirs for one lease.
        self.lease = Lease(train.lease_s, holder=UNKNOWN, seen=clock())
        self._sweeper: asyncio.Task[None] | None = None
        self._owed = False  # a release that the store refused, tried again at the next look
        self._lock: IO[str] | None = None  # the run folder's trainer.lock, while a remote trainer trains

    @property
    def incoming(self) -> Path:
        """Where uploads land while they are checked: hidden files beside the version folders."""
        return self.run_dir / CHECKPOINTS

    async def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._lock is not None:
            self._lock.close()

    def hold(self, trainer: str) -> float:
        """Renew `trainer`'s lease (TrainerBusy if another holds it, or a trainer on this host holds
        the run folder); the lease's length."""
        self._lock_folder()
        ago = self.lease.take(trainer, self.clock())
        if ago is not None:
            raise TrainerBusy(
                f"another trainer ({self.lease.holder}) holds this gateway's samples: heard from "
                f"{ago:.0f} s ago, its lease (train.lease_s = {self.cfg.lease_s:g} s) runs on"
            )
        return self.cfg.lease_s

    def _lock_folder(self) -> None:
        """Hold the run folder's `trainer.lock` for the remote trainer, as a local trainer holds it:
        neither trains the store while the other does (TrainerBusy here, exit 3 there)."""
        if self._lock is not None:
            return
        try:
            self._lock = hold(self.run_dir, TRAINER_LOCK, "trainer")
        except FolderLocked as exc:
            raise TrainerBusy(
                f"a trainer on the gateway's host (pid {exc.pid or 'unknown'}) trains {self.run_dir}"
            ) from None

    def health(self) -> dict[str, Any]:
        """`trainer` on the gateway's /healthz: the remote trainer training now, if one is."""
        holder = self.lease.holder or None  # UNKNOWN: nobody has called since the gateway started
        ago = None if holder is None else round(self.clock() - self.lease.seen, 1)
        # "off" while none holds it: `clawrl eval` and `clawrl envs train` refuse a server making no version
        status = "remote" if holder is not None else "off"
        return {"status": status, "remote": holder, "heard_s_ago": ago, "lease_s": self.cfg.lease_s}

    async def call(self, trainer: str, name: str, args: dict[str, Any]) -> Any:
        """Run the store call `name` (KeyError: no such call; pydantic's ValidationError: arguments
        it does not take) for `trainer`."""
        model, fn = CALLS[name]
        checked = model.model_validate(args)
        self.hold(trainer)
        return await self.db(fn, self.store, checked)

    async def publish(self, trainer: str, name: str, tar: Path) -> Version:
        """Publish the checked tar `tar` (deleted after) as `name`; see the module."""
        stack = ExitStack()
        try:
            await asyncio.to_thread(stack.enter_context, publish_lock(self.run_dir))
            self.hold(trainer)
            user = version_user(checked_name(name))
            latest = await self.db(self.store.latest_version, user)
            if name != (expected := version_name(user, latest.number + 1)):
                raise PublishConflict(
                    f"{name} cannot be published: {latest.name} is {user}'s latest, next is {expected}"
                )
            version, trained = await asyncio.to_thread(self._write, name, tar, latest.number)
            try:
                await self.db(self.store.publish_version, version, trained)
            except StoreError as exc:
                if version.path is not None:
                    await asyncio.to_thread(set_aside, Path(version.path), "refused")
                raise PublishConflict(f"{name} cannot be published: {exc}") from None
            log.info("published %s, trained by a remote trainer (%d samples)", name, len(trained))
            await asyncio.to_thread(self._prune, user)
            return version
        finally:
            stack.close()
            tar.unlink(missing_ok=True)

    async def folder(self, trainer: str, name: str) -> Packed:
        """`name`'s folder packed (the caller deletes the tar); NoFolder when it has none."""
        self.hold(trainer)
        known = {v.name: v for v in await self.db(self.store.versions, None)}
        if name not in known or known[name].path is None:
            raise NoFolder(f"{name} has no folder here" if name in known else f"no version {name}")
        return await asyncio.to_thread(self._pack, Path(known[name].path or ""))

    def _write(self, name: str, tar: Path, latest: int) -> tuple[Version, list[int]]:
        """Under the publish lock: the folder written from the tar; the version and its samples."""
        final = version_dir(self.run_dir, name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", suffix=".tmp", dir=final.parent))
        try:
            version, trained = described(unpack(tar, tmp), name)
            files = list(tmp.iterdir())
            if files and not (tmp / MANIFEST).is_file():
                raise UploadRefused(f"the upload of {name} has files but no {MANIFEST}")
            claim_next(self.run_dir, latest, version_user(name))  # a crash's leftover set aside
            if files:  # none: a LoRA rollback to v0 (the adapter off)
                folder = write_folder(
                    self.run_dir, name, lambda into: [p.rename(into / p.name) for p in files]
                )
                version.path = str(folder)
            return version, trained
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self, user: str) -> None:
        """Under the publish lock: the line pruned as the trainer prunes its own (train/prune.py)."""
        versions = self.store.versions(user)  # reads are safe from any thread (store/db.py)
        servable = next(v for v in reversed(versions) if not v.held)
        last = self.store.served_version(user if self.per_user else None)
        pruning = choose(
            versions=versions,
            served={servable.name, last or "v0"},
            keep=self.cfg.keep_versions,
            full=self.cfg.weights == "full",
            every=self.cfg.keep_every or 0,
        )
        try:
            prune(self.run_dir, pruning)
        except (OSError, ValueError) as exc:  # pruning again after the next version is enough
            log.error("could not prune old versions: %s", exc)

    def _pack(self, folder: Path) -> Packed:
        with publish_lock(self.run_dir):  # not pruned while it is read
            if not (folder / MANIFEST).is_file():
                raise NoFolder(f"{folder.name} has no folder here")
            return pack(folder, None, self.incoming)

    async def _sweep(self) -> None:
        every = max(0.2, self.cfg.lease_s / 4)
        while True:
            await asyncio.sleep(every)
            gone = self.lease.expired(self.clock())
            if gone is not None or self._owed:
                await self._hand_back(gone)

    async def let_go(self, trainer: str) -> None:
        """`trainer` stops: its lease is free now, and whatever it still claimed back in the queue."""
        if self.lease.holder == trainer:
            self.lease.holder = None
            await self._hand_back(trainer, "stopped")

    async def _hand_back(self, gone: str | None, why: str = "lease") -> None:
        """A lease ran out (or its trainer stopped): every claimed sample back to the queue, and the
        run folder let go."""
        try:
            self._lock_folder()
        except TrainerBusy:  # a trainer on this host trains the folder: the claims are its own
            self._owed = False
            return
        try:
            released = await self.db(self.store.release_samples)
        except StoreError as exc:
            self._owed = True
            log.error("could not hand back a vanished trainer's claims (tried again): %s", exc)
            return
        self._owed = False
        if self.lease.holder is None and self._lock is not None:  # no trainer came meanwhile
            self._lock.close()
            self._lock = None
        who = f"the remote trainer {gone}" if gone else "a trainer from before this gateway started"
        if why == "stopped":
            log.info("%s stopped; %d claimed samples are ready again", who, released)
        elif gone or released:
            log.log(
                logging.WARNING if released else logging.INFO,
                "%s was not heard from for %g s (train.lease_s): %d claimed samples are ready again",
                who,
                self.cfg.lease_s,
                released,
            )


def checked_name(name: str) -> str:
    """`name`, a version's name (`vN`, `<user>/vN`); UploadRefused otherwise."""
    try:
        version_user(name)
    except ValueError as exc:
        raise UploadRefused(str(exc)) from None
    return name


def described(meta: dict[str, Any] | None, name: str) -> tuple[Version, list[int]]:
    """The version an upload's publish.json describes (its path unset) and its samples;
    UploadRefused when it says nothing, or names another version."""
    try:
        assert meta is not None
        version = version_of({**meta["version"], "path": None})
        trained = [int(i) for i in meta["trained"]]
    except (AssertionError, KeyError, TypeError, ValueError) as exc:
        raise UploadRefused(f"the upload of {name} does not say what it is ({exc!r})") from None
    if version.name != name:
        raise UploadRefused(f"the upload names {version.name}, not {name}")
    return version, trained
