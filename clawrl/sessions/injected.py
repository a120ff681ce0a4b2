"""Messages a client injects around the conversation, which are not part of it.

Agents add context for the model that they do not keep in their history: OpenClaw
(2026.9) appends a user message `<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> ...
<<<END_OPENCLAW_INTERNAL_CONTEXT>>>` (active exec sessions, subagents) to each request
and drops it from the next one. Left in, it would break every history match (the
next request does not start with the previous one) and it would be judged as if
the user had said it.

A user message whose text matches one of `collect.context_patterns` (regular
expressions, searched case-insensitively) is such a message. Sessions match
histories, type turns and take next states on the conversation without them; the
turn still records every message and token the model saw.
"""

from __future__ import annotations

import re

from clawrl.sessions.messages import text_of
from clawrl.types import Message

DEFAULT_CONTEXT_PATTERNS = [r"^\s*<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"]


class InjectedContext:
    def __init__(self, patterns: list[str]) -> None:
        self._patterns = [re.compile(p, re.IGNORECASE) for p in patterns]

    def is_injected(self, message: Message) -> bool:
        if message.get("role") != "user" or not self._patterns:
            return False
        text = text_of(message.get("content"))
        return any(p.search(text) for p in self._patterns)

    def conversation(self, messages: list[Message]) -> list[Message]:
        """The messages without the injected ones (all of them if nothing else is left)."""
        return [m for m in messages if not self.is_injected(m)] or messages
