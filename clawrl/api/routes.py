"""HTTP routes. Thin: validate, hand to the service on `app.state`, return."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from clawrl.api.auth import Keys, bearer_guard, caller_of
from clawrl.api.body import guarded_json_route
from clawrl.api.completions import ChatService
from clawrl.api.errors import NotFound, documented_errors
from clawrl.api.memory import memory_wanted
from clawrl.api.schemas import ChatCompletionRequest, FeedbackRequest
from clawrl.api.session_hints import hints_from
from clawrl.model.sampling import SamplingDefaults
from clawrl.types import DEFAULT_USER

STARTED = int(time.time())
# With "stream": true the answer is server-sent events; without, a chat.completion object.
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}, "description": "The answer"}
}


def v1_router(keys: Keys) -> APIRouter:
    router = APIRouter(
        prefix="/v1",
        route_class=guarded_json_route(bearer_guard(keys)),
        responses=documented_errors(400, 401, 404, 413, 500, 503),
    )

    @router.post("/chat/completions", responses=STREAMED)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        chat: ChatService = request.app.state.chat
        caller = caller_of(request)
        hints = hints_from(request.headers, body, request.app.state.affinity_keys, caller)
        prep = chat.prepare(body)
        request.state.chat = prep  # read by the metrics middleware: tokens and time to first token
        await chat.begin(prep, hints, memory_wanted(request.headers, body))
        headers = {"X-Session-Id": caller.shown(prep.resolution.session_id)} if prep.resolution else {}
        if body.stream:
            headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(chat.stream(prep), media_type="text/event-stream", headers=headers)
        result = await until_disconnected(request, chat.complete(prep))
        if result is None:
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    @router.post("/feedback")
    async def feedback(body: FeedbackRequest, request: Request) -> dict[str, Any]:
        collector = request.app.state.chat.collector
        if collector is None:
            raise NotFound("feedback needs collection on (collect.enabled = true)", code="collect_disabled")
        caller = caller_of(request)
        session_id = caller.session_id(body.session_id) if body.session_id is not None else None
        turn, fid = await collector.feedback(
            response_id=body.response_id,
            session_id=session_id,
            rating=body.rating,
            comment=body.comment,
            owner=caller.owner,
        )
        return {
            "object": "feedback",
            "id": fid,
            "response_id": turn.id,
            "session_id": caller.shown(turn.session_id),
            "rating": body.rating,
        }

    @router.get("/models")
    async def models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(request)]}

    @router.get("/models/{model_id}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        card = _model_card(request)
        if model_id != card["id"]:
            raise NotFound(f"the model {model_id!r} does not exist", param="model", code="model_not_found")
        return card

    return router


def health_router(keys: Keys) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        """200 while the engine can serve; 503 (same body) while it cannot, e.g. vLLM restarting. With
        users on (docs/users.md), only the admin key gets the details; others get the status, the
        model and the version: their own, with an adapter per user."""
        caller = keys.bearer(request) if keys.several else None
        detailed = not keys.several or (caller is not None and caller.admin)
        user = caller.user if caller is not None else DEFAULT_USER
        body, status = await request.app.state.health.body(detailed, user)
        return JSONResponse(body, status_code=status)

    return router


def _model_card(request: Request) -> dict[str, Any]:
    chat: ChatService = request.app.state.chat
    return {
        "id": chat.model_name,
        "object": "model",
        "created": STARTED,
        "owned_by": "clawrl",
        "max_model_len": chat.engine.max_context,
        "version": chat.engine.version,
        "sampling_defaults": _sampling(chat.engine.sampling_defaults),
        "reasoning": chat.thinks,  # answers come with reasoning unless the request turns it off
    }


def _sampling(d: SamplingDefaults) -> dict[str, Any]:
    """What a request that names no temperature, top_p, top_k or penalty samples with, and from where."""
    return {
        "temperature": d.temperature,
        "top_p": d.top_p,
        "top_k": d.top_k,
        "repetition_penalty": d.repetition_penalty,
        "presence_penalty": d.presence_penalty,
        "frequency_penalty": d.frequency_penalty,
        "source": d.source,
    }


async def until_disconnected(request: Request, work: Any) -> Any:
    """Await `work`, cancelling it if the client hangs up first (returns None then)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()  # closes the engine generator, which drops the request from the batch
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
