"""Comparing message histories the way clients echo them back.

Clients resend the whole history on every request, but rarely byte for byte:
the assistant message we returned may come back with `content: ""` instead of
null, with extra fields (`refusal`, `annotations`), re-serialised tool-call
arguments, or content as a list of text parts. `canonical` keeps what the model
saw: the role (`developer` = `system`), the text, and the tool calls' names and
arguments. Tool-call ids and unknown fields are ignored.

`prefix_hashes` chains SHA-256 over canonical messages, so "does this request
start with that history?" is a dictionary lookup per prefix length.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from clawrl.types import Message


def text_of(content: Any) -> str:
    """Message content as text: strings as they are, text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text") or "" for part in content if isinstance(part, dict))


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.strip()
    return raw


def canonical(message: Message) -> str:
    role = "system" if message.get("role") == "developer" else message.get("role")
    calls = [
        [call.get("function", {}).get("name"), _arguments(call.get("function", {}).get("arguments"))]
        for call in message.get("tool_calls") or []
    ]
    return json.dumps(
        [role, text_of(message.get("content")).strip(), calls], sort_keys=True, ensure_ascii=False
    )


def prefix_hashes(messages: list[Message]) -> list[str]:
    """hashes[k] identifies messages[: k + 1]."""
    out: list[str] = []
    state = ""
    for message in messages:
        state = extend_hash(state, message)
        out.append(state)
    return out


def extend_hash(previous: str, message: Message) -> str:
    """The hash of a history one message longer than the one `previous` identifies."""
    return hashlib.sha256((previous + canonical(message)).encode()).hexdigest()
