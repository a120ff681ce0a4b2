"""The runner's HTTP client of a clawrl server: what any OpenAI client sends, plus the episode route.

- `complete`: `POST /v1/chat/completions` (not streamed), the episode's session named by
  the `X-Session-Id` header, the turn typed `main`;
- `post_episode`: `POST /v1/episodes`, the episode's reward and how it ended (the route's
  body and answer: docs/environments.md, "The episode route"); posting ends the session;
- `health`: `GET /healthz`: the version served, the trainer, the canary gate's held versions.

The connection, the key and `/healthz` are `clawrl.client.ServerClient`'s, shared with
`clawrl eval`. A refused chat request is `ContextFull` (the
conversation outgrew the model's window: the episode ends "token_limit") or `Refused`
(dropped), and so is an answer that does not come within the client's timeout (600 s); a
refused post is `Refused`; no connection, or a 5xx, is `ServerError`, which stops the run.
"""

from __future__ import annotations

from typing import Any

import httpx

from clawrl.client import ServerClient, body_of, error_code, error_message
from clawrl.envs.episode import ContextFull, Refused, Reply
from clawrl.envs.errors import ServerError
from clawrl.version_folder import fingerprint_version

# The training signal is the policy's: a penalty the server would apply by default (the embedded
# model's repetition guard) draws tokens the trainer's logprobs do not account for.
NO_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class EnvClient(ServerClient):
    """Talks to one clawrl server at `base_url` (its root or its `/v1` URL)."""

    unreachable = ServerError
    not_clawrl = ServerError

    async def health(self, ok: tuple[int, ...] = (200, 503)) -> dict[str, Any]:
        """`GET /healthz` (its body also comes with a 503 while the engine cannot serve)."""
        return await super().health(ok)

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
            response = await self.send("POST", "/v1/chat/completions", json=body, headers=headers)
        except ServerError as exc:
            if isinstance(exc.__cause__, httpx.TimeoutException):  # a busy server: this episode is dropped
                raise Refused(f"no answer within {self.timeout_s:g} s") from exc
            raise
        if response.status_code == 400 and error_code(response) == "context_length_exceeded":
            raise ContextFull(error_message(response))
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
        response = await self.send("POST", "/v1/episodes", json=body)
        if response.status_code == 404 and error_code(response) is None and "error" not in body_of(response):
            raise ServerError(
                f"{self.root} has no POST /v1/episodes route (a clawrl server without Track 2?)"
            )
        return _json(response, "POST /v1/episodes")

    async def close_group(self, group_id: str, reason: str) -> dict[str, Any]:
        """`POST /v1/episodes/groups/{id}/close`: the group closes with the episodes it has."""
        path = f"/v1/episodes/groups/{group_id}/close"
        return _json(await self.send("POST", path, json={"reason": reason}), f"POST {path}")


def _json(response: httpx.Response, what: str, ok: tuple[int, ...] = (200,)) -> dict[str, Any]:
    """The JSON object of an answer; Refused for a 4xx, ServerError for anything else unexpected."""
    if response.status_code not in ok:
        text = f"{what}: http {response.status_code}: {error_message(response)}"
        if 400 <= response.status_code < 500 and response.status_code != 401:
            raise Refused(text)
        raise ServerError(text)
    body = body_of(response)
    if not body:
        raise ServerError(f"{what}: expected a JSON object, got {response.text[:200]!r}")
    return body
