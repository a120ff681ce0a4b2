"""The routes of a remote trainer (`clawrl train --server URL`, clawrl/train/remote/): admin key only.

    POST /v1/trainer/heartbeat          {"lease_s"}: the lease renewed (taken, for a new trainer)
    DELETE /v1/trainer/lease            the trainer stops: its lease free, its claims back in the queue
    POST /v1/trainer/store/{call}       {"result"}: one of the store's calls (train/remote/wire.py)
    PUT  /v1/trainer/versions/{name}    a version's tar stream, `X-Clawrl-Sha256` its sum: published
    GET  /v1/trainer/versions/{name}    a version's folder as a tar stream, `X-Clawrl-Sha256` its sum

Every request names its trainer in `X-Clawrl-Trainer`. Refused: any key but the admin's, 401, before
a byte of the body is read (nothing is claimed); another trainer while the lease of the one training
is alive, 409 `trainer_busy`; an upload whose sum differs, 400 `checksum_mismatch`, and one that is
no version folder, 400 `bad_upload` (the version is not announced); a name that is not the line's
next, or samples that are not the trainer's, 409 `version_conflict`; a gateway that trains with its
own trainer (`train.enabled`) or records nothing, 404 `no_remote_training`. Uploads are not bound by
`server.max_body_bytes` (a version is larger); they stream to a hidden file as they arrive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from clawrl.api.auth import Keys, bearer_guard
from clawrl.api.body import guarded_json_route
from clawrl.api.errors import APIError, BadRequest, Conflicting, NotFound, StoreUnavailable, documented_errors
from clawrl.store.errors import StoreBusy, StoreUnwritable
from clawrl.train.remote.desk import TrainerDesk, checked_name
from clawrl.train.remote.errors import ChecksumMismatch, NoFolder, PublishConflict, TrainerBusy, UploadRefused
from clawrl.train.remote.folders import Incoming
from clawrl.train.remote.wire import CALLS

UPLOADS = "/v1/trainer/versions/"  # the one prefix whose bodies `server.max_body_bytes` does not bound
TRAINER, SHA256 = "x-clawrl-trainer", "x-clawrl-sha256"


def trainer_router(keys: Keys) -> APIRouter:
    router = APIRouter(
        prefix="/v1/trainer",
        route_class=guarded_json_route(bearer_guard(keys, admin_only=True)),
        responses=documented_errors(400, 401, 404, 409, 503),
    )

    @router.post("/heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        desk, trainer = _desk(request), _trainer(request)
        with _refusals():
            return {"lease_s": desk.hold(trainer)}

    @router.delete("/lease")
    async def let_go(request: Request) -> dict[str, Any]:
        await _desk(request).let_go(_trainer(request))
        return {"object": "trainer.lease", "released": True}

    @router.post("/store/{call}")
    async def store_call(call: str, request: Request) -> Response:
        desk, trainer = _desk(request), _trainer(request)
        if call not in CALLS:
            raise NotFound(
                f"no store call {call!r} for a trainer (there are {', '.join(CALLS)})", code="no_call"
            )
        args = await request.json()
        if not isinstance(args, dict):
            raise BadRequest("a store call's body is a JSON object of its arguments")
        try:
            with _refusals():
                result = await desk.call(trainer, call, args)
        except ValidationError as exc:
            raise BadRequest(f"{call}: {exc.errors(include_url=False)}", code="bad_arguments") from None
        # Not JSONResponse: a sample's logprobs may be -inf, which it refuses (the client reads them).
        return Response(json.dumps({"result": result}), media_type="application/json")

    @router.put("/versions/{name:path}")
    async def upload(name: str, request: Request) -> dict[str, Any]:
        desk, trainer = _desk(request), _trainer(request)
        expected = request.headers.get(SHA256)
        if not expected:
            raise BadRequest(f"an upload names its sha256 in {SHA256}", code="bad_upload")
        with _refusals():
            desk.hold(trainer)  # before a byte is kept
            checked_name(name)
        incoming = Incoming(desk.incoming)
        try:
            async for chunk in request.stream():
                incoming.write(chunk)
        except BaseException:
            incoming.discard()
            raise
        with _refusals():
            version = await desk.publish(trainer, name, incoming.finish(expected))
        return {"object": "trainer.version", "version": version.name, "status": version.status}

    @router.get(
        "/versions/{name:path}",
        response_class=FileResponse,
        responses={200: {"content": {"application/x-tar": {}}, "description": "the folder as a tar stream"}},
    )
    async def download(name: str, request: Request) -> FileResponse:
        desk, trainer = _desk(request), _trainer(request)
        with _refusals():
            packed = await desk.folder(trainer, name)
        return FileResponse(
            packed.path,
            media_type="application/x-tar",
            headers={SHA256: packed.sha256},
            background=BackgroundTask(packed.path.unlink, missing_ok=True),
        )

    return router


def _desk(request: Request) -> TrainerDesk:
    desk: TrainerDesk | None = request.app.state.trainer_desk
    if desk is None:
        raise NotFound(
            "this gateway takes no remote trainer: it runs its own (train.enabled = true) or records "
            "nothing (collect.enabled = false)",
            code="no_remote_training",
        )
    return desk


def _trainer(request: Request) -> str:
    trainer = request.headers.get(TRAINER)
    if not trainer:
        raise BadRequest(f"a trainer names itself in {TRAINER}", code="no_trainer_id")
    return trainer


REFUSALS: tuple[tuple[type[Exception], type[APIError], str], ...] = (
    (ChecksumMismatch, BadRequest, "checksum_mismatch"),  # before its base class
    (UploadRefused, BadRequest, "bad_upload"),
    (TrainerBusy, Conflicting, "trainer_busy"),
    (PublishConflict, Conflicting, "version_conflict"),
    (NoFolder, NotFound, "no_folder"),
    (StoreBusy, StoreUnavailable, "store_unavailable"),
    (StoreUnwritable, StoreUnavailable, "store_unavailable"),
)


@contextmanager
def _refusals() -> Iterator[None]:
    """The remote trainer's refusals (train/remote/errors.py) and a store that takes no write now,
    as the API's errors."""
    try:
        yield
    except tuple(e for e, _, _ in REFUSALS) as exc:
        error, code = next((api, code) for e, api, code in REFUSALS if isinstance(exc, e))
        raise error(str(exc), code=code) from None
