"""Judge backends: where judge calls go. One interface, `complete(messages) -> text`.

    JudgeCallFailed     a call that produced no usable text: timeout, connection refused,
                        an HTTP error status, a body that is not JSON or not a chat completion

- `OpenAIJudge`: any OpenAI-compatible endpoint (vLLM, llama.cpp server, Ollama, a
  clawrl server). One `httpx.AsyncClient`, created at start and closed at stop.
- `LocalJudge`: the server's own engine. Its requests are marked `background`, so
  the engine admits them only after every waiting served request. They run on
  the weights being served, i.e. the latest trained version: the engine keeps
  LoRA merged into one set of weights, so there is no adapter to switch off.

Retries, timeouts and the bound on calls in flight belong to the judge loop
(`judge/worker.py`), not to the backends.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any, Protocol

import httpx

from clawrl.chat.template import ChatRenderer
from clawrl.chat.text import IncrementalDetokenizer
from clawrl.engine.base import Engine, SamplingParams
from clawrl.net import pool_limits


class JudgeCallFailed(RuntimeError):
    """A judge call that produced no text."""


class JudgeBackend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def complete(self, messages: list[dict[str, Any]], temperature: float, max_tokens: int) -> str: ...


class OpenAIJudge:
    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float) -> None:
        self.name = f"openai:{model}"
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers, limits=pool_limits())

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def complete(self, messages: list[dict[str, Any]], temperature: float, max_tokens: int) -> str:
        assert self._client is not None, "start() the backend first"
        body = {
            "model": self._model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        try:
            response = await self._client.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            raise JudgeCallFailed(f"timeout after {self._timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise JudgeCallFailed(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise JudgeCallFailed(f"http {response.status_code}: {response.text[:200]}")
        return _content(response)


def _content(response: httpx.Response) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise JudgeCallFailed(f"not a chat completion: {response.text[:200]!r}") from exc
    if not isinstance(content, str):
        raise JudgeCallFailed("the completion has no text content")
    return content


class LocalJudge:
    def __init__(self, engine: Engine, renderer: ChatRenderer) -> None:
        self.engine = engine
        self.renderer = renderer
        self.name = "local"

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def complete(self, messages: list[dict[str, Any]], temperature: float, max_tokens: int) -> str:
        prompt = self.renderer.render(messages).prompt_ids
        room = self.engine.max_context - len(prompt)
        if room <= 0:
            raise JudgeCallFailed(f"the judge prompt ({len(prompt)} tokens) does not fit the context")
        params = SamplingParams(
            max_tokens=min(max_tokens, room),
            temperature=temperature,
            stop_token_ids=self.engine.stop_token_ids,
            background=True,
        )
        detok = IncrementalDetokenizer(self.renderer.tokenizer)
        text = []
        async with aclosing(self.engine.generate(prompt, params)) as tokens:
            async for event in tokens:
                text.append(detok.add(event.token_id))
        return "".join(text) + detok.flush()
