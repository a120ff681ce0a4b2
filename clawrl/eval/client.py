"""A plain OpenAI-API client for evaluations: what any chat client sends, nothing private.

`EvalClient` speaks to a clawrl server over HTTP (`clawrl.client.ServerClient`, shared with
`clawrl envs`: one connection pool, the key, `/healthz`):

- `chat`: `POST /v1/chat/completions` (not streamed), with the session named by the
  `X-Session-Id` header, the turn typed by `X-Turn-Type` (eval answers are `side`, so
  they are never trained on) and `session_done` on a conversation's last request;
- `feedback`: `POST /v1/feedback`, a thumbs up/down with an optional comment;
- `health`: `GET /healthz` (the served policy version, judge, trainer and memory status);
- `experiences`: `GET /v1/memory`, the experiences by state (`active`, `distilled`, `retired`).

Exceptions:
    EvalError(RuntimeError)   base: what stops an evaluation, with a message for the user
    └── ServerUnreachable     no HTTP answer at the base URL (down, wrong port, not clawrl)
    Unanswered(Exception)     one turn through OpenClaw gave no answer: counted, the eval goes on
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from clawrl.client import ServerClient
from clawrl.version_folder import fingerprint_version


class EvalError(RuntimeError):
    """An evaluation cannot go on; the message says why."""


class ServerUnreachable(EvalError):
    """Nothing answered HTTP at the server's address."""


class Unanswered(Exception):
    """One turn gave no answer the eval can use (an OpenClaw call that failed, timed out or was not
    recorded): counted, and the conversation ends; never an EvalError, which stops the eval."""


@dataclass(frozen=True)
class Answer:
    """One assistant answer: its completion id (the id feedback names), text and policy version."""

    id: str
    text: str
    version: str  # from system_fingerprint ("clawrl-v3" -> "v3"); "" when the server gives none
    finish_reason: str


class EvalClient(ServerClient):
    """Talks to one clawrl server at `base_url` (the server root, or its `/v1` URL)."""

    unreachable = ServerUnreachable
    not_clawrl = EvalError
    unanswered = 0  # turns that raised Unanswered (on the bare API: a request that timed out)

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
        memory: bool | None = None,
    ) -> Answer:
        """One answer to `messages` in session `session_id`; `memory` True / False: the server's memory
        block asked for (even on a side turn) / refused, None: the server's default."""
        headers = turn_headers(session_id, side, memory)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if done:
            body["session_done"] = True
        try:
            response = await self.send("POST", "/v1/chat/completions", json=body, headers=headers)
        except self.unreachable as exc:
            # A server too busy to answer within the timeout (a loaded CPU) has lost one turn, not
            # the run: the turn is counted unanswered and its conversation ends, as through OpenClaw.
            if not isinstance(exc.__cause__, httpx.TimeoutException):
                raise
            self.unanswered += 1
            raise Unanswered(f"POST /v1/chat/completions: no answer in {self.timeout_s:g} s") from exc
        data = _json(response, "POST /v1/chat/completions")
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            return Answer(
                data["id"], text, fingerprint_version(data.get("system_fingerprint")), choice["finish_reason"]
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise EvalError(f"not a chat completion: {str(data)[:200]}") from exc

    async def experiences(self) -> dict[str, int]:
        """How many of the server's experiences are in each state (docs/memory.md)."""
        data = _json(await self.send("GET", "/v1/memory"), "GET /v1/memory").get("data") or []
        counts = {"active": 0, "distilled": 0, "retired": 0}
        for e in data:
            counts[str(e.get("state"))] = counts.get(str(e.get("state")), 0) + 1
        return counts

    async def feedback(self, response_id: str, rating: int, comment: str | None) -> None:
        """Rate one answer, as a user with thumbs up/down and a comment box would."""
        body: dict[str, Any] = {"response_id": response_id, "rating": rating}
        if comment:
            body["comment"] = comment
        _json(await self.send("POST", "/v1/feedback", json=body), "POST /v1/feedback")


def turn_headers(session_id: str, side: bool, memory: bool | None = None) -> dict[str, str]:
    """The headers that name a request's session and type its turn (eval answers are `side`), and
    ask for the memory block or refuse it (`X-Memory`, docs/memory.md; None: no header)."""
    headers = {"X-Session-Id": session_id, "X-Turn-Type": "side" if side else "main"}
    if memory is not None:
        headers["X-Memory"] = "on" if memory else "off"
    return headers


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
