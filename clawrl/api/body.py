"""How request bodies are read: a size limit, and JSON strict enough to trust.

`BodyLimit` is an ASGI middleware. A request whose `Content-Length` is over
`server.max_body_bytes` is answered 413 from its headers, before a byte of the
body is read; a chunked body is counted while it is read, and reading stops at
the first chunk past the limit (the route answers 413 then).

`parse_json` is the JSON decoder the routes use in place of `json.loads`. It
refuses, as a JSON error (a 400 with the OpenAI error body), what Python's
decoder would let through or fail on in a way a client cannot read:
invalid UTF-8, `NaN` / `Infinity` / numbers that overflow to infinity, integers
longer than Python converts, and nesting deeper than `MAX_DEPTH` (deeper
structures would exhaust the recursion of the code that later walks them:
validation, chat templates, the store's JSON).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clawrl.api.errors import PayloadTooLarge, error_response

MAX_DEPTH = 64  # objects and arrays inside one another; OpenAI tool schemas use a handful


class BodyTooLarge(HTTPException):
    """Raised while reading a body that grows past the limit; the app answers it with a 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large_message(limit))


def too_large_message(limit: int) -> str:
    return f"the request body is larger than the server's limit of {limit} bytes (server.max_body_bytes)"


class BodyLimit:
    """Refuse request bodies over `max_bytes`: from the Content-Length header, or by counting chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int, exempt: tuple[str, ...] = ()) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.exempt = exempt  # path prefixes whose routes bound their own bodies (a version's upload)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            too_large = PayloadTooLarge(too_large_message(self.max_bytes), code="request_too_large")
            await error_response(too_large)(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        return counted


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # the HTTP server refuses these before they get here
                return None
    return None


def parse_json(body: bytes) -> Any:
    """Decode a request body; every refusal is a `json.JSONDecodeError` naming the problem."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"the body is not UTF-8 text ({exc.reason})", "", exc.start) from exc
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise _too_deep() from exc
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer longer than Python converts
        raise json.JSONDecodeError(str(exc), "", 0) from exc
    if _depth(value) > MAX_DEPTH:
        raise _too_deep()
    return value


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number: numbers must be finite", "", 0)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise json.JSONDecodeError(f"the number {text[:40]} is too large: numbers must be finite", "", 0)
    return value


def _too_deep() -> json.JSONDecodeError:
    return json.JSONDecodeError(f"objects and arrays are nested deeper than {MAX_DEPTH} levels", "", 0)


def _depth(value: Any) -> int:
    """How deeply objects and arrays nest in `value` (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth  # enough to refuse; no need to walk the rest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


class StrictJSONRequest(Request):
    """A request whose `.json()` is `parse_json`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


Guard = Callable[[Request], Awaitable[None]]


def guarded_json_route(guard: Guard) -> type[APIRoute]:
    """A route class that awaits `guard` (the API-key check) before a byte of the body is read, then
    decodes the JSON body with `parse_json` (FastAPI turns its errors into a 400).

    A FastAPI dependency would run only after the body has been read and parsed: an unauthenticated
    client could make the server parse `max_body_bytes` of JSON per request.
    """

    class GuardedJSONRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                await guard(request)
                return await handler(StrictJSONRequest(request.scope, request.receive, request._send))

            return guarded

    return GuardedJSONRoute
