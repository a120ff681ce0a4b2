"""`clawrl eval --via openclaw`: the simulated users talk through the real OpenClaw agent.

`OpenClawClient` is `EvalClient` with `chat` going through `openclaw agent --local` (the
README's lean profile, clawrl/eval/openclaw.py) instead of a bare API request. Each eval
session is one OpenClaw session with a HOME of its own under `folder/homes/`, all sharing
one workspace (its path is in OpenClaw's system prompt, so the sessions' prompts share a
prefix the server's cache serves). OpenClaw keeps the conversation: each call sends only the
last user message, and OpenClaw wraps it (time stamp, `Runtime:` line) and resends its
history, as it does for a user.

What a bare request sets in its body or headers is set in that session's openclaw.json
before each call, through the provider's static `headers` and the model's params:

- the session is named by `X-Session-Id` (the eval's session id; OpenClaw's own affinity
  key is still sent and loses to it), the turn typed by `X-Turn-Type` (held-out answers are
  `side`, never trained), the last message of a conversation sends `X-Session-Done`, and
  `X-Memory` asks for the server's memory block or refuses it (held-out answers, measured both
  ways on a server with memory on);
- `temperature` 0 (held-out answers) is pinned in the model's params; any other temperature
  is left to OpenClaw, which sends none, so the model's own sampling defaults apply, as for
  a user; `max_tokens` is the model entry's `maxTokens`.

OpenClaw writes its own session id into every user message (`Runtime: ... sessionId=...`), and
the model reads it: a held-out answer is asked under one OpenClaw session id, `HELD_OUT_SESSION`,
at every version (in a fresh HOME each time, so no history carries over), so each version answers
the very same prompt; the server still files it under the eval's session (`X-Session-Id`).

OpenClaw does not show the completion id, which `POST /v1/feedback` names: after each call
the answer's turn is read from the server (`/dashboard/session.json`, the session's newest
turn of the right type), which also gives the version that wrote it. An OpenClaw call that
fails or times out, or whose turn never appears, is `Unanswered`: counted, never a crash
(clawrl/eval/scenario.py ends that conversation, or scores that held-out answer 0).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

from clawrl.client import body_of
from clawrl.eval.client import Answer, EvalClient, EvalError, Unanswered, turn_headers
from clawrl.eval.openclaw import (
    SETUP_SCRIPT,
    installed_openclaw,
    openclaw_config,
    run_agent_async,
    write_home,
)

HELD_OUT_SESSION = "held-out"  # OpenClaw's session id for every held-out answer (see the module's doc)
RECORDED_WITHIN_S = 30.0  # an answered turn is in the store well within this
TURN_TIMEOUT_S = 600.0  # one OpenClaw turn: a ~2,500-token prompt prefilled on a loaded CPU


def find_openclaw(cache_dir: Path) -> Path:
    """The installed `openclaw` launcher; EvalError naming scripts/setup-openclaw if there is none."""
    found = installed_openclaw(cache_dir)
    if found is None:
        raise EvalError(f"--via openclaw needs the OpenClaw agent: install it once with {SETUP_SCRIPT}")
    return found


def session_config(
    base_url: str,
    api_key: str | None,
    workspace: Path,
    session_id: str,
    temperature: float,
    max_tokens: int,
    side: bool,
    done: bool,
    memory: bool | None = None,
    reasoning: bool = False,
) -> dict[str, Any]:
    """The openclaw.json of one eval call: what a bare request says in its body and headers, as the
    provider's static headers and the model's params (see the module's doc); `reasoning`: the
    served model thinks (its model card says so)."""
    headers = turn_headers(session_id, side, memory)
    if done:
        headers["X-Session-Done"] = "true"
    return openclaw_config(
        base_url,
        max_tokens=max_tokens,
        workspace=str(workspace),
        temperature=0.0 if temperature == 0 else None,
        api_key=api_key,
        headers=headers,
        reasoning=reasoning,
    )


class OpenClawClient(EvalClient):
    """An eval client whose answers come through `openclaw agent --local` (see the module's doc)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        openclaw: Path,
        folder: Path,
        turn_timeout_s: float = TURN_TIMEOUT_S,
        workspace: Path | None = None,
    ) -> None:
        super().__init__(base_url, api_key)
        self.openclaw, self.folder, self.turn_timeout_s = openclaw, folder.resolve(), turn_timeout_s
        self.api_key = api_key
        self.workspace = (workspace or folder / "workspace").resolve()  # in OpenClaw's system prompt
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.unanswered = 0
        self.last_error = ""
        self._reasoning: bool | None = None  # the model card's, read once

    async def thinks(self) -> bool:
        """Whether the served model thinks (its model card's `reasoning`; read once): the OpenClaw
        model entry says the same, so OpenClaw keeps its reasoning apart from its answers."""
        if self._reasoning is None:
            response = await self.send("GET", "/v1/models")
            cards = body_of(response).get("data") or [{}]
            self._reasoning = bool(cards[0].get("reasoning", False))
        return self._reasoning

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
        home = self.folder / "homes" / session_id
        config = session_config(
            base_url=f"{self.root}/v1",
            api_key=self.api_key,
            workspace=self.workspace,
            session_id=session_id,
            temperature=temperature,
            max_tokens=max_tokens,
            side=side,
            done=done,
            memory=memory,
            reasoning=await self.thinks(),
        )
        write_home(home, config)
        before = len(await self._turns(session_id))
        agent_session = HELD_OUT_SESSION if side else session_id  # in the prompt OpenClaw writes
        try:
            reply = await run_agent_async(
                openclaw=self.openclaw,
                home=home,
                session=agent_session,
                message=messages[-1]["content"],
                timeout=self.turn_timeout_s,
                cwd=self.workspace,
            )
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            raise self._unanswered(f"openclaw: {exc}") from exc
        turn = await self._new_turn(session_id, before, "side" if side else "main")
        versions = turn.get("versions") or [""]
        return Answer(turn["id"], reply.text, str(versions[-1]), str(turn.get("finish_reason") or ""))

    def _unanswered(self, why: str) -> Unanswered:
        self.unanswered += 1
        self.last_error = why[-500:]
        return Unanswered(why)

    async def _turns(self, session_id: str) -> list[dict[str, Any]]:
        response = await self.send("GET", "/dashboard/session.json", params={"id": session_id})
        if response.status_code == 404:
            return []
        if response.status_code != 200:
            raise EvalError(
                f"GET /dashboard/session.json: http {response.status_code}: {response.text[:300]}"
            )
        return list(response.json().get("turns", []))

    async def _new_turn(self, session_id: str, before: int, turn_type: str) -> dict[str, Any]:
        """The session's newest turn of `turn_type` past the first `before`, once it is recorded."""
        deadline = time.monotonic() + RECORDED_WITHIN_S
        while True:
            new = [t for t in (await self._turns(session_id))[before:] if t.get("type") == turn_type]
            if new:
                return new[-1]
            if time.monotonic() > deadline:
                raise self._unanswered(
                    f"OpenClaw answered, but no {turn_type} turn of {session_id} was recorded"
                )
            await asyncio.sleep(0.2)
