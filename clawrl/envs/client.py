"""The runner's HTTP client of a clawrl server: what any OpenAI client sends, plus the episode route.

- `complete`: `POST /v1/chat/completions` (not streamed), the episode's session named by
  the `X-Session-Id` header, the turn typed `main`;
- `post_episode`: `POST /v1/episodes`, the episode's reward and how it ended (the route's
  body and answer: docs/environments.md, "The episode route"); posting ends the session;
- `health`: `GET /healthz`: the version served, the trainer, the canary gate's held versions.

`Authorization: Bearer KEY` on every request when the server has a key. One
`httpx.AsyncClient` for the whole run. A refused chat request is `ContextFull` (the
conversation outgrew the model's window: the episode ends "token_limit") or `Refused`
(dropped), and so is an answer that does not come within the client's timeout (600 s); a
refused post is `Refused`; no connection, or a 5xx, is `ServerError`, which stops the run.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from clawrl.envs.episode import ContextFull, Refused, Reply
from clawrl.envs.errors import ServerError
from clawrl.net import pool_limits
from clawrl.version_folder import fingerprint_version

# The training signal is the policy's: a penalty the server would apply by default (the embedded
# model's repetition guard) draws tokens the trainer's logprobs do not account for.
NO_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class EnvClient:
    """Talks to one clawrl server at `base_url` (its root or its `/v1` URL)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.root = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=self.root, headers=headers, timeout=timeout_s, limits=pool_limits()
        )
        self.model = "clawrl"

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._http.aclose()

    async def health(self) -> dict[str, Any]:
        """`GET /healthz` (its body also comes with a 503 while the engine cannot serve)."""
        response = await self._send("GET", "/healthz", timeout=30.0)
        body = _json(response, "GET /healthz", ok=(200, 503))
        if not isinstance(body.get("version"), str):
            raise ServerError(
                f"{self.root}/healthz does not look like a clawrl server: {response.text[:200]}"
            )
        self.model = body.get("model") or self.model
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None,
        *,
        session_id: str,
        max_tokens: int,
        temperature: float | None,
    ) -> Reply:
        """One answer in session `session_id`."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        body |= NO_PENALTIES  # an episode is the policy's own answer: no repetition guard shapes it
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        if temperature is not None:
            body["temperature"] = temperature
        headers = {"X-Session-Id": session_id, "X-Turn-Type": "main"}
        try:
            response = await self._send("POST", "/v1/chat/completions", json=body, headers=headers)
        except ServerError as exc:
            if isinstance(exc.__cause__, httpx.TimeoutException):  # a busy server: this episode is dropped
                raise Refused(f"no answer within {self.timeout_s:g} s") from exc
            raise
        if response.status_code == 400 and _code(response) == "context_length_exceeded":
            raise ContextFull(_message(response))
        data = _json(response, "POST /v1/chat/completions")
        try:
            choice = data["choices"][0]
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
            message = {k: v for k, v in choice["message"].items() if v is not None or k == "content"}
            return Reply(
                message,
                str(choice["finish_reason"]),
                tokens,
                fingerprint_version(data.get("system_fingerprint")),
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ServerError(f"not a chat completion: {str(data)[:200]}") from exc

    async def post_episode(self, body: dict[str, Any]) -> dict[str, Any]:
        """`POST /v1/episodes`; the answer's JSON (`episode` and `group`)."""
        response = await self._send("POST", "/v1/episodes", json=body)
        if response.status_code == 404 and _code(response) is None and "error" not in _body(response):
            raise ServerError(
                f"{self.root} has no POST /v1/episodes route (a clawrl server without Track 2?)"
            )
        return _json(response, "POST /v1/episodes")

    async def close_group(self, group_id: str, reason: str) -> dict[str, Any]:
        """`POST /v1/episodes/groups/{id}/close`: the group closes with the episodes it has."""
        path = f"/v1/episodes/groups/{group_id}/close"
        return _json(await self._send("POST", path, json={"reason": reason}), f"POST {path}")

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ServerError(f"{method} {self.root}{path} failed: {type(exc).__name__}: {exc}") from exc


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(response: httpx.Response) -> str | None:
    error = _body(response).get("error")
    return error.get("code") if isinstance(error, dict) else None


def _message(response: httpx.Response) -> str:
    error = _body(response).get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return response.text[:300]


def _json(response: httpx.Response, what: str, ok: tuple[int, ...] = (200,)) -> dict[str, Any]:
    """The JSON object of an answer; Refused for a 4xx, ServerError for anything else unexpected."""
    if response.status_code not in ok:
        text = f"{what}: http {response.status_code}: {_message(response)}"
        if 400 <= response.status_code < 500 and response.status_code != 401:
            raise Refused(text)
        raise ServerError(text)
    body = _body(response)
    if not body:
        raise ServerError(f"{what}: expected a JSON object, got {response.text[:200]!r}")
    return body
