"""Errors the API answers with, in the OpenAI shape.

Every client mistake becomes a 4xx whose body is
`{"error": {"message", "type", "param", "code"}}`, as the OpenAI API and vLLM
answer, so SDKs raise their usual exception types with a readable message.

    APIError                 base: status code + OpenAI error type
    ├── BadRequest           400 invalid_request_error
    ├── Unauthorized         401 authentication_error
    ├── Forbidden            403 permission_error (a user's key on an admin route that says so)
    ├── NotFound             404 not_found_error
    ├── Conflicting          409 invalid_request_error (an episode posted twice, ...)
    ├── PayloadTooLarge      413 invalid_request_error (over server.max_body_bytes)
    ├── ModelUnavailable     503 service_unavailable (the model failed, or its server is not up)
    └── StoreUnavailable     503 service_unavailable (the store refuses writes: disk full, locked)

The services below the API raise their own errors (`clawrl/collect/errors.py`);
`SERVICE_ERRORS` says which HTTP error each one is, in one place.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from clawrl.collect.errors import CollectError, Conflict, NotRecorded, RecordingRefused

log = logging.getLogger(__name__)


class APIError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class BadRequest(APIError):
    status, type = 400, "invalid_request_error"


class Unauthorized(APIError):
    status, type = 401, "authentication_error"


class Forbidden(APIError):
    status, type = 403, "permission_error"


class NotFound(APIError):
    status, type = 404, "not_found_error"


class Conflicting(APIError):
    status, type = 409, "invalid_request_error"


class PayloadTooLarge(APIError):
    status, type = 413, "invalid_request_error"


class ModelUnavailable(APIError):
    status, type = 503, "service_unavailable"


class StoreUnavailable(APIError):
    status, type = 503, "service_unavailable"


SERVICE_ERRORS: dict[type[CollectError], type[APIError]] = {
    NotRecorded: NotFound,
    Conflict: Conflicting,
    RecordingRefused: StoreUnavailable,
}


def from_service(exc: CollectError) -> APIError:
    """The HTTP error a service error is (a 500 for one not in `SERVICE_ERRORS`)."""
    kind = next((api for svc, api in SERVICE_ERRORS.items() if isinstance(exc, svc)), APIError)
    return kind(exc.message, param=exc.param, code=exc.code)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx, as the OpenAI API answers."""

    error: ErrorDetail


def documented_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error statuses, all with the OpenAI error body."""
    return {status: {"model": ErrorBody, "description": HTTPStatus(status).phrase} for status in statuses}


def without_422(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI schema without FastAPI's 422 entries: clawrl answers validation errors 400."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        why = (first.get("ctx") or {}).get("error") or first.get("msg")
        return f"the request body is not valid JSON: {why}", None
    param = ".".join(loc) or None
    where = f"{param}: " if param else ""
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}{first.get('msg')}{more}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(CollectError)
    async def _service_error(_: Request, exc: CollectError) -> JSONResponse:
        return error_response(from_service(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this answer; the client gets the OpenAI shape, no internals.
        return JSONResponse(error_body("internal server error", "server_error"), status_code=500)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if exc.status_code == 413 else None
        return JSONResponse(error_body(str(exc.detail), kind, code=code), status_code=exc.status_code)
