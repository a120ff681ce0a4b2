"""Building OpenAI-shaped response objects: completions, stream chunks, logprobs, usage.

A thinking answer's reasoning (clawrl/chat/reasoning.py) goes out under two names with the same
text, on the message and on stream deltas: `reasoning` (vLLM's since vllm#27752) and
`reasoning_content` (DeepSeek's, which LiteLLM and the Vercel AI SDK read). An answer without
reasoning has neither field. Empty content is `null`, as OpenAI sends it (an answer cut inside its
think block).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from transformers import PreTrainedTokenizerBase

from clawrl.chat.tools import ToolCall
from clawrl.engine.base import TokenEvent
from clawrl.version_folder import fingerprint_of

UNLIKELY = -9999.0  # OpenAI's logprob for a token with no probability (JSON has no -inf)


@dataclass
class Completion:
    """What one request produced, accumulated while it streams."""

    id: str
    created: int
    model: str
    prompt_ids: list[int]
    tokens: list[TokenEvent] = field(default_factory=list)
    text: str = ""  # the content
    reasoning: str = ""  # the text of the think block, the tags left out
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None

    versions: list[str] = field(
        default_factory=list
    )  # versions that made the tokens, a new entry at each swap

    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    reasoning_tokens: int = 0  # completion tokens of the think block, its tags included
    cached_version: str | None = None  # an older version that computed those tokens' KV (TokenEvent)
    replicas: list[str] = field(default_factory=list)  # a replica set's servers that decoded it, in order

    def add(self, token: TokenEvent) -> None:
        self.tokens.append(token)
        self.cached_tokens += token.cached_tokens
        self.cached_version = token.cached_version or self.cached_version
        if token.replica is not None:
            self.replicas.append(token.replica)
        if not self.versions or self.versions[-1] != token.version:
            self.versions.append(token.version)

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts prefix-cache hits,
        `completion_tokens_details.reasoning_tokens` a thinking answer's think block."""
        prompt, completion = len(self.prompt_ids), len(self.tokens)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if self.reasoning_tokens:  # a thinking answer's, as OpenAI reports them (OpenClaw reads it)
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage


class TokenText:
    """Token ID -> its text, as shown in logprobs."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._decode = lru_cache(maxsize=65536)(lambda i: tokenizer.decode([i]))

    def entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """One token's logprob entry; a logprob that is not finite (-inf: a token masked out) is
        OpenAI's -9999.0, as JSON has no infinity."""
        text = self._decode(token_id)
        shown = logprob if math.isfinite(logprob) else UNLIKELY
        return {"token": text, "logprob": shown, "bytes": list(text.encode())}

    def logprobs(self, events: list[TokenEvent], top: int) -> dict[str, Any]:
        content = []
        for ev in events:
            item = self.entry(ev.token_id, ev.logprob)
            item["top_logprobs"] = [self.entry(i, lp) for i, lp in ev.top_logprobs[:top]]
            content.append(item)
        return {"content": content}


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if index is not None:
        out["index"] = index
    return out


def reasoning_delta(text: str) -> dict[str, str]:
    """Reasoning under both names clients read."""
    return {"reasoning": text, "reasoning_content": text}


def completion_json(c: Completion, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text or None}
    if c.reasoning:
        message.update(reasoning_delta(c.reasoning))
    if c.tool_calls:
        message["tool_calls"] = [tool_call_json(call) for call in c.tool_calls]
    return {
        "id": c.id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": _fingerprint(c),
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": c.finish_reason}],
        "usage": c.usage(),
    }


def chunk_json(
    c: Completion,
    delta: dict[str, Any] | None,
    *,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    usage: bool = False,
) -> str:
    """One SSE event. `delta=None` with `usage=True` is the final usage-only chunk."""
    body: dict[str, Any] = {
        "id": c.id,
        "object": "chat.completion.chunk",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": _fingerprint(c),
        "choices": [],
    }
    if delta is not None:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        body["choices"] = [choice]
    if usage:
        body["usage"] = c.usage()
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _fingerprint(c: Completion) -> str:
    """The policy version that made the answer, e.g. `clawrl-v3`, or `clawrl-alice-v3` for a user's own
    (`alice/v3`, docs/users.md); the last one when a swap happened."""
    versions = c.versions
    return fingerprint_of(versions[-1]) if versions else "clawrl"
