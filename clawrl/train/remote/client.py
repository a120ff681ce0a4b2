"""`RemoteStore`: the store as a remote trainer sees it, through its gateway's API (desk.py's routes).

It has exactly the methods of `Store` that the trainer loop, the canary gate and the wiring call
(wire.py), so `TrainLoop` runs unchanged, and two of its own:

- `publish_version(version, trained)` packs the version's folder (written by the trainer into its
  own run folder, as always) with the row's fields into one tar stream and uploads it with its
  sha256; the gateway publishes it or refuses it (`UploadRefused`, `PublishConflict`). A
  stream corrupted on the way is sent once more; refused, the local folder is set aside, so it is
  never taken for the gateway's version of that name.
- `fetch(version)` is where the trainer loads a version from: its own folder of that name, or,
  when it has none (a trainer started in an empty run folder, a rollback published on the
  gateway), the gateway's, downloaded and checked against its sha256 first.

Versions' paths are the trainer's own (`<run_dir>/checkpoints/vN`), not the gateway's. A
heartbeat thread renews the lease every third of it while a step runs. A request that cannot
reach the gateway (refused, reset, timed out) or finds it unable to write (503) is tried again,
waiting twice as long each time up to `RETRY_MAX_S`, for as long as it takes: a trainer cut off
reconnects and goes on where it was; if its lease ran out meanwhile, its claims went back to the
queue, and it still publishes them if no other trainer took them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import httpx

from clawrl.train.checkpoints import CheckpointError, set_aside, write_folder
from clawrl.train.remote.errors import (
    ChecksumMismatch,
    NoFolder,
    PublishConflict,
    RemoteError,
    TrainerBusy,
    TrainerRefused,
    UploadRefused,
)
from clawrl.train.remote.folders import Incoming, Packed, pack, unpack
from clawrl.train.remote.wire import sample_of, version_of
from clawrl.types import DEFAULT_USER, Sample, Version
from clawrl.version_folder import CHECKPOINTS, MANIFEST, version_dir

log = logging.getLogger("clawrl.trainer")
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line a request: the loop polls the gateway
RETRY_MAX_S = 30.0
TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # a publish writes a whole version on the gateway
TRAINER, SHA256 = "X-Clawrl-Trainer", "X-Clawrl-Sha256"
# (status, the error body's code) -> what the trainer raises; a code of None: any code
REFUSALS: dict[tuple[int, str | None], type[RemoteError]] = {
    (401, None): TrainerRefused,
    (404, "no_remote_training"): TrainerRefused,
    (404, "no_folder"): NoFolder,
    (409, "trainer_busy"): TrainerBusy,
    (409, "version_conflict"): PublishConflict,
    (400, "checksum_mismatch"): ChecksumMismatch,
    (400, "bad_upload"): UploadRefused,
}


class RemoteStore:
    def __init__(self, url: str, api_key: str | None, run_dir: Path) -> None:
        self.url, self.run_dir = url.rstrip("/"), Path(run_dir)
        self.trainer = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        headers = {TRAINER: self.trainer} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT)
        self._beats = httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(30.0))
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    @classmethod
    def connect(cls, url: str, api_key: str | None, run_dir: Path) -> RemoteStore:
        """Take the gateway's lease (TrainerRefused, TrainerBusy: nothing was done) and keep it."""
        store = cls(url, api_key, run_dir)
        try:
            lease_s = float(store._request("POST", "/v1/trainer/heartbeat", retry=False).json()["lease_s"])
        except httpx.HTTPStatusError as exc:  # not a gateway that takes a trainer (another server, a proxy)
            store.close()
            raise TrainerRefused(f"{url} is no clawrl gateway taking a trainer: {exc}") from None
        except BaseException:
            store.close()
            raise
        store._heart = threading.Thread(
            target=store._beat, args=(lease_s / 3,), name="clawrl-heartbeat", daemon=True
        )
        store._heart.start()
        log.info("training for %s as %s (lease %g s)", store.url, store.trainer, lease_s)
        return store

    # The store's methods the trainer calls (wire.CALLS), with Store's signatures.

    def versions(self, user: str | None = DEFAULT_USER) -> list[Version]:
        return [self._local(version_of(v)) for v in self._call("versions", user=user)]

    def latest_version(self, user: str = DEFAULT_USER) -> Version:
        return self._local(version_of(self._call("latest_version", user=user)))

    def served_version(self, user: str | None = None) -> str | None:
        return self._call("served_version", user=user)

    def claim_samples(self, ids: list[int]) -> list[int]:
        return self._call("claim_samples", ids=ids)

    def release_samples(self, ids: list[int] | None = None) -> int:
        return self._call("release_samples", ids=ids)

    def fail_samples(self, ids: list[int], reason: str, limit: int) -> list[int]:
        return self._call("fail_samples", ids=ids, reason=reason, limit=limit)

    def ready_samples(
        self,
        limit: int | None = None,
        user: str | None = None,
        users: Collection[str] | None = None,
        untried: bool = False,
    ) -> list[Sample]:
        found = self._call("ready_samples", limit=limit, user=user, users=_listed(users), untried=untried)
        return [sample_of(s) for s in found]

    def count_samples(
        self, status: str | None = None, kind: str | None = None, users: Collection[str] | None = None
    ) -> int:
        return self._call("count_samples", status=status, kind=kind, users=_listed(users))

    def ready_counts(self, users: Collection[str] | None = None) -> dict[str, int]:
        return self._call("ready_counts", users=_listed(users))

    def leave_out_samples(self, reasons: dict[int, str], status: str) -> int:
        return self._call("leave_out_samples", reasons={str(k): v for k, v in reasons.items()}, status=status)

    def recent_token_ids(self, limit: int, user: str | None = None) -> list[tuple[list[int], list[int]]]:
        return [(p, r) for p, r in self._call("recent_token_ids", limit=limit, user=user)]

    def publish_version(self, version: Version, trained: list[int]) -> None:
        """Upload `version` (its folder at its path, in this run folder) and the samples it trained."""
        meta = {"version": {k: v for k, v in dataclasses.asdict(version).items() if k != "path"}}
        meta["trained"] = list(trained)
        folder = Path(version.path) if version.path else None
        for attempt in (1, 2):
            packed = pack(folder, meta, self.run_dir / CHECKPOINTS)
            try:
                self.upload(version.name, packed)
                return
            except ChecksumMismatch as exc:
                if attempt == 2:
                    self._aside(folder)
                    raise
                log.warning("the upload of %s arrived garbled (%s); sending it again", version.name, exc)
            except (UploadRefused, PublishConflict):
                self._aside(folder)
                raise
            finally:
                packed.path.unlink(missing_ok=True)

    def upload(self, name: str, packed: Packed) -> None:
        """Send one packed version as `name`; the gateway's refusal raised."""
        self._request(
            "PUT",
            f"/v1/trainer/versions/{name}",
            content=lambda: open(packed.path, "rb"),  # noqa: SIM115 -- httpx reads and closes it
            headers={SHA256: packed.sha256},
        )

    def fetch(self, version: Version) -> Path | None:
        """The folder to load `version` from, downloaded first if this run folder lacks it (None: no
        folder, the base). CheckpointError when the gateway has none or it arrives garbled twice."""
        if version.path is None:
            return None
        folder = version_dir(self.run_dir, version.name)
        if (folder / MANIFEST).is_file():
            return folder
        for attempt in (1, 2):
            try:
                return self._download(version.name)
            except NoFolder as exc:
                raise CheckpointError(str(exc)) from None
            except ChecksumMismatch as exc:
                if attempt == 2:
                    raise CheckpointError(f"{version.name} arrived garbled twice: {exc}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop the heartbeat and give the lease back (a trainer after this one need not wait for it
        to run out); a gateway that cannot be reached lets it run out."""
        self._stop.set()
        if self._heart is not None and not self._beats.is_closed:
            self._heart.join(timeout=5)
            try:
                self._beats.delete("/v1/trainer/lease")
            except httpx.HTTPError as exc:
                log.warning("could not give the lease back to %s (it runs out): %s", self.url, exc)
        self._http.close()
        self._beats.close()

    def _download(self, name: str) -> Path:
        incoming = Incoming(self.run_dir / CHECKPOINTS)
        try:
            response = self._stream("GET", f"/v1/trainer/versions/{name}")
            try:
                for chunk in response.iter_bytes():
                    incoming.write(chunk)
            finally:
                response.close()
            expected = response.headers.get(SHA256, "")
        except BaseException:
            incoming.discard()
            raise
        tar = incoming.finish(expected)
        try:
            folder = write_folder(self.run_dir, name, lambda into: unpack(tar, into))
        finally:
            tar.unlink(missing_ok=True)
        log.info("downloaded %s from %s", name, self.url)
        return folder

    def _local(self, v: Version) -> Version:
        """`v` with its folder in this run folder (where `fetch` puts it)."""
        if v.path is not None:
            v.path = str(version_dir(self.run_dir, v.name))
        return v

    def _aside(self, folder: Path | None) -> None:
        if folder is not None and folder.is_dir():
            set_aside(folder, "refused")

    def _call(self, name: str, **args: Any) -> Any:
        return self._request("POST", f"/v1/trainer/store/{name}", json=args).json()["result"]

    def _request(
        self,
        method: str,
        path: str,
        *,
        retry: bool = True,
        content: Callable[[], Any] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        """One request, tried again while the gateway cannot be reached (see the module)."""
        wait, failing = 1.0, False
        while True:
            try:
                body = {} if content is None else {"content": content()}
                response = self._http.request(method, path, **body, **kw)
            except httpx.TransportError as exc:
                if not retry:
                    raise TrainerRefused(f"cannot reach the gateway at {self.url}: {exc}") from None
                failing = _waiting(failing, f"cannot reach the gateway at {self.url} ({exc!r})", wait)
            else:
                if response.status_code != 503 or not retry:
                    if failing:
                        log.info("reached the gateway at %s again", self.url)
                    return _checked(response)
                failing = _waiting(failing, f"the gateway cannot write its store now ({response.text})", wait)
            time.sleep(wait)
            wait = min(2 * wait, RETRY_MAX_S)

    def _stream(self, method: str, path: str) -> httpx.Response:
        """A streamed response, checked (a download: tried once; `fetch` tries again)."""
        request = self._http.build_request(method, path)
        response = self._http.send(request, stream=True)
        if response.status_code >= 400:
            response.read()
            response.close()
            _checked(response)
        return response

    def _beat(self, every_s: float) -> None:
        """The heartbeat: the lease renewed every `every_s` while the trainer runs."""
        while not self._stop.wait(every_s):
            try:
                _checked(self._beats.post("/v1/trainer/heartbeat"))
            except (httpx.HTTPError, RemoteError) as exc:  # the next call of the loop says more
                log.warning("heartbeat to %s failed: %s", self.url, exc)


def _checked(response: httpx.Response) -> httpx.Response:
    """The response, or the error the gateway's refusal is (REFUSALS), or httpx's for the rest."""
    if response.status_code < 400:
        return response
    try:
        error = response.json()["error"]
        message, code = error["message"], error.get("code")
    except (ValueError, KeyError, TypeError):
        message, code = response.text, None
    kind = REFUSALS.get((response.status_code, code)) or REFUSALS.get((response.status_code, None))
    if kind is not None:
        raise kind(f"the gateway refused ({response.status_code}): {message}")
    response.raise_for_status()
    return response


def _waiting(failing: bool, why: str, wait: float) -> bool:
    if not failing:
        log.warning("%s; trying again every %g s and up to every %g s", why, wait, RETRY_MAX_S)
    return True


def _listed(users: Collection[str] | None) -> list[str] | None:
    return None if users is None else sorted(users)
