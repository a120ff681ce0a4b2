"""A simulated user played by a language model behind any OpenAI-compatible endpoint.

`LLMPersona(get_persona("student"), base_url, model)` keeps the scripted persona's
opening message (so every run sees the same conversations) and its `description`, and
asks the model for the rest:

- `score`: "how well does this answer meet your preference, 0 to 1?" -> the first
  number in the reply, which must lie in [0, 1];
- `reply`: a verdict in a fixed three-line format (VERDICT / MESSAGE / COMMENT).

One `httpx.Client` per persona, closed by `close()` (or by leaving a `with` block).
Calls run at temperature 0 with a timeout, so a judge model that is down or slow fails
the call instead of hanging the evaluation.

Exceptions:
    PersonaError(RuntimeError)  the endpoint could not be reached, answered with an HTTP
                                error or a body that is no chat completion, or its text
                                holds no score / verdict in the asked-for format
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

import httpx

from clawrl.eval.personas.base import Persona, Reply
from clawrl.eval.tasks import Task

_SCORE = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_VERDICT = re.compile(r"^\W*verdict\W*:\W*(accept|reject)\b", re.IGNORECASE | re.MULTILINE)
_MESSAGE = re.compile(r"^\W*message\W*:(.*?)(?=^\W*comment\W*:|\Z)", re.IGNORECASE | re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"^\W*comment\W*:(.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)
_NONE = {"", "none", "n/a", "-"}

SCORE_ASK = (
    "How well does the assistant's answer meet your preference, from 0 (not at all) to 1 (fully)? "
    "Reply with the number only."
)
REPLY_ASK = (
    "This was the assistant's answer number {turn}. Decide whether you are satisfied with it, "
    "then answer in exactly this format:\n"
    "VERDICT: ACCEPT or REJECT\n"
    "MESSAGE: what you say next to the assistant (thanks if you accept; if you reject, say exactly "
    "what it should change)\n"
    "COMMENT: if you reject, one short instruction saying what to change; otherwise none"
)


class PersonaError(RuntimeError):
    """The persona's model gave no usable score or reply."""


class LLMPersona:
    def __init__(
        self,
        persona: Persona,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.persona = persona
        self.name = f"llm:{persona.name}"
        self.description = persona.description
        self.max_turns = persona.max_turns
        self.model = model
        self._url = base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> LLMPersona:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def first_message(self, task: Task) -> str:
        return self.persona.first_message(task)

    def score(self, task: Task, answer: str) -> float:
        text = self._ask(self._messages(task, answer, SCORE_ASK), max_tokens=16)
        return parse_score(text)

    def reply(self, task: Task, answer: str, turn: int) -> Reply:
        if turn < 1:
            raise ValueError(f"turn counts answers from 1, got {turn}")
        text = self._ask(self._messages(task, answer, REPLY_ASK.format(turn=turn)), max_tokens=256)
        return parse_reply(text, done_anyway=turn >= self.max_turns)

    def _messages(self, task: Task, answer: str, ask: str) -> list[dict[str, str]]:
        system = (
            "You are role-playing a user talking to an AI assistant. Stay in character.\n"
            f"Who you are and what you prefer: {self.description}"
        )
        known = "" if task.answer is None else f"\nIts correct answer: {task.answer}"
        user = (
            f"The problem: {task.question}{known}\n\n"
            f"Your message to the assistant was:\n{self.first_message(task)}\n\n"
            f"The assistant answered:\n{answer}\n\n{ask}"
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _ask(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": max_tokens,
        }
        try:
            response = self._client.post(self._url, json=body)
        except httpx.HTTPError as exc:
            raise PersonaError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise PersonaError(f"{self.name}: http {response.status_code}: {response.text[:200]}")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PersonaError(f"{self.name}: not a chat completion: {response.text[:200]!r}") from exc
        if not isinstance(content, str):
            raise PersonaError(f"{self.name}: the completion has no text content")
        return content


def parse_score(text: str) -> float:
    """The first number in `text`, which must lie in [0, 1]."""
    match = _SCORE.search(text)
    if match is None:
        raise PersonaError(f"no score in the persona's reply: {text[:200]!r}")
    value = float(match.group())
    if not 0.0 <= value <= 1.0:
        raise PersonaError(f"score {value:g} is outside [0, 1] in the persona's reply: {text[:200]!r}")
    return value


def parse_reply(text: str, done_anyway: bool) -> Reply:
    """A `Reply` from the VERDICT / MESSAGE / COMMENT format; a rejection must say something."""
    verdict = _VERDICT.search(text)
    if verdict is None:
        raise PersonaError(f"no VERDICT: ACCEPT or REJECT in the persona's reply: {text[:200]!r}")
    message, comment = _field(_MESSAGE, text), _field(_COMMENT, text)
    if verdict.group(1).lower() == "accept":
        return Reply(message, rating=1, comment=None, done=True)
    if message is None:
        raise PersonaError(f"the persona rejected the answer without a MESSAGE: {text[:200]!r}")
    return Reply(message, rating=-1, comment=comment, done=done_anyway)


def _field(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    if match is None:
        return None
    value = match.group(1).strip()
    return None if value.lower() in _NONE else value
