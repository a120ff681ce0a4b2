"""A plain OpenAI-API client for evaluations: what any chat client sends, nothing private.

`ServerClient` speaks to a clawrl server over HTTP with one `httpx.AsyncClient`:

- `chat`: `POST /v1/chat/completions` (not streamed), with the session named by the
  `X-Session-Id` header, the turn typed by `X-Turn-Type` (eval answers are `side`, so
  they are never trained on) and `session_done` on a conversation's last request;
- `feedback`: `POST /v1/feedback`, a thumbs up/down with an optional comment;
- `health`: `GET /healthz` (the served policy version, judge and trainer status).

Exceptions:
    EvalError(RuntimeError)   base: what stops an evaluation, with a message for the user
    └── ServerUnreachable     no HTTP answer at the base URL (down, wrong port, not clawrl)
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from clawrl.net import pool_limits
from clawrl.version_folder import fingerprint_version


class EvalError(RuntimeError):
    """An evaluation cannot go on; the message says why."""


class ServerUnreachable(EvalError):
    """Nothing answered HTTP at the server's address."""


@dataclass(frozen=True)
class Answer:
    """One assistant answer: its completion id (the id feedback names), text and policy version."""

    id: str
    text: str
    version: str  # from system_fingerprint ("clawrl-v3" -> "v3"); "" when the server gives none
    finish_reason: str


class ServerClient:
    """Talks to one clawrl server at `base_url` (the server root, or its `/v1` URL)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
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

    async def health(self) -> dict[str, Any]:
        """`GET /healthz`; ServerUnreachable when nothing answers, EvalError when it is not clawrl's."""
        try:
            response = await self._http.get("/healthz", timeout=10.0)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"no clawrl server at {self.root}: {type(exc).__name__}: {exc}") from exc
        body = _json(response, "GET /healthz")
        if not isinstance(body.get("version"), str):
            raise EvalError(f"{self.root}/healthz does not look like a clawrl server: {response.text[:200]}")
        self.model = body.get("model") or self.model
        return body

    async def version(self) -> str:
        """The policy version served now."""
        return str((await self.health())["version"])

    async def chat(
        self,
        messages: list[dict[str, str]],
        session_id: str,
        *,
        temperature: float,
        max_tokens: int,
        side: bool = False,
        done: bool = False,
    ) -> Answer:
        """One answer to `messages` in session `session_id`."""
        headers = {"X-Session-Id": session_id, "X-Turn-Type": "side" if side else "main"}
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if done:
            body["session_done"] = True
        data = _json(await self._post("/v1/chat/completions", body, headers), "POST /v1/chat/completions")
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            return Answer(
                data["id"], text, fingerprint_version(data.get("system_fingerprint")), choice["finish_reason"]
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise EvalError(f"not a chat completion: {str(data)[:200]}") from exc

    async def feedback(self, response_id: str, rating: int, comment: str | None) -> None:
        """Rate one answer, as a user with thumbs up/down and a comment box would."""
        body: dict[str, Any] = {"response_id": response_id, "rating": rating}
        if comment:
            body["comment"] = comment
        _json(await self._post("/v1/feedback", body, {}), "POST /v1/feedback")

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        try:
            return await self._http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"POST {self.root}{path} failed: {type(exc).__name__}: {exc}") from exc


def _json(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON object of a 200 answer; EvalError naming the request otherwise."""
    if response.status_code != 200:
        raise EvalError(f"{what}: http {response.status_code}: {response.text[:300]}")
    try:
        body = response.json()
    except ValueError as exc:
        raise EvalError(f"{what}: the answer is not JSON: {response.text[:200]!r}") from exc
    if not isinstance(body, dict):
        raise EvalError(f"{what}: expected a JSON object, got {response.text[:200]!r}")
    return body
