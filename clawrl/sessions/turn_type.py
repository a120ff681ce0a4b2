"""Telling main turns (the conversation itself, trainable) from side turns.

A side turn is served and recorded but never trained on: a title, a summary, a
memory compaction, a heartbeat. Explicit `X-Turn-Type` / `turn_type` wins;
otherwise a request is side when its last user message matches one of the
configured patterns (regular expressions, searched case-insensitively).

The defaults cover generic clients and OpenClaw's housekeeping requests as its
2026.9 release sends them (checked against the installed package): the
pre-compaction memory flush ("Pre-compaction memory flush. Store durable
memories only in memory/YYYY-MM-DD.md ..."), the compaction summary of a turn
too large to keep ("This is the PREFIX of a turn that was too large to keep
... Summarize the prefix"), and heartbeats ("Follow the heartbeat monitor
scratch context ...", HEARTBEAT_OK).
"""

from __future__ import annotations

import re

from clawrl.sessions.messages import text_of
from clawrl.types import Message, TurnType

DEFAULT_SIDE_PATTERNS = [
    r"\b(generate|create|write|suggest|give|make)\b.{0,40}\btitle\b",
    r"\btitle (for|of) (this|the) (conversation|chat|discussion)\b",
    r"\bsummari[sz]e\b.{0,60}\b(conversation|chat|discussion|above|history|session)\b",
    r"\b(compact(ion)?|condense|compress(ion)?)\b.{0,40}\b(conversation|history|context|memory)\b",
    r"^\s*\W{0,3}heartbeat\b",
    r"\bpre-compaction memory flush\b",
    r"\bstore durable memories only in memory/",
    r"\bprefix of a turn that was too large to keep\b",
    r"\bsummari[sz]e the prefix\b",
    r"\bheartbeat monitor scratch context\b",
    r"\bHEARTBEAT_OK\b",
]


class SidePatterns:
    def __init__(self, patterns: list[str]) -> None:
        self._patterns = [re.compile(p, re.IGNORECASE) for p in patterns]

    def matches(self, messages: list[Message]) -> bool:
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        if last_user is None:
            return False
        text = text_of(last_user.get("content"))
        return any(p.search(text) for p in self._patterns)


def infer_turn_type(explicit: TurnType | None, messages: list[Message], patterns: SidePatterns) -> TurnType:
    if explicit is not None:
        return explicit
    return "side" if patterns.matches(messages) else "main"
