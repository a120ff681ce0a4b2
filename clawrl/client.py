"""One HTTP client of a clawrl server, shared by `clawrl eval` and `clawrl envs`.

`ServerClient` holds one `httpx.AsyncClient` for a whole run (idle connections expire under
the server's keep-alive: `clawrl.net.pool_limits`), sends `Authorization: Bearer KEY` when the
server has a key, and knows what every caller of the server needs:

- `send`: any request; no HTTP answer at all (down, wrong port, a timeout) raises the
  subclass's `unreachable` error, naming the request;
- `health`: `GET /healthz`, checked to be a clawrl server's (its `version`), which also
  learns the model name requests should carry;
- `body_of`, `error_code`, `error_message`: an answer's JSON object and its OpenAI-style
  error fields, whatever the status.

Each caller keeps its own errors (`clawrl.eval.client`, `clawrl.envs.client`): a subclass
names them in `unreachable` and `not_clawrl`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from clawrl.net import pool_limits


class ServerClient:
    """Talks to one clawrl server at `base_url` (the server root, or its `/v1` URL)."""

    unreachable: type[Exception] = ConnectionError  # no HTTP answer came
    not_clawrl: type[Exception] = RuntimeError  # an answer came, but not a clawrl server's

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.root, headers=headers, timeout=timeout_s, limits=pool_limits()
        )
        self.model = "clawrl"

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._http.aclose()

    async def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request; `unreachable` (from the httpx error) when no answer comes."""
        try:
            return await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise self.unreachable(f"{method} {self.root}{path} failed: {type(exc).__name__}: {exc}") from exc

    async def health(self, ok: tuple[int, ...] = (200,)) -> dict[str, Any]:
        """`GET /healthz`'s body (any status in `ok`); `not_clawrl` for another status or body."""
        try:
            response = await self.send("GET", "/healthz", timeout=30.0)
        except self.unreachable as exc:
            raise self.unreachable(f"no clawrl server at {self.root}: {exc}") from exc
        body = body_of(response)
        if response.status_code not in ok:
            raise self.not_clawrl(f"GET /healthz: http {response.status_code}: {error_message(response)}")
        if not isinstance(body.get("version"), str):
            raise self.not_clawrl(
                f"{self.root}/healthz does not look like a clawrl server: {response.text[:200]}"
            )
        self.model = body.get("model") or self.model
        return body


def body_of(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object; {} when it is not JSON or not an object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def error_code(response: httpx.Response) -> str | None:
    """The OpenAI-style `error.code` of an answer, if it has one."""
    error = body_of(response).get("error")
    return error.get("code") if isinstance(error, dict) else None


def error_message(response: httpx.Response) -> str:
    """The OpenAI-style `error.message` of an answer, else the start of its text."""
    error = body_of(response).get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return response.text[:300]
