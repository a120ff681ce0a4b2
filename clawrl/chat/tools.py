"""Tool-call parsing of model output, for whole texts and for streams.

A tool call is written by the model as one block per call (the Hermes/Qwen
format, also what the generic tool prompt of `clawrl.chat.template` asks for):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Accepted variations: `"parameters"` instead of `"arguments"`; arguments
given as a JSON string; missing arguments (taken as `{}`); a JSON list of
call objects inside one block; an unterminated last block (models often
stop at end-of-sequence before `</tool_call>`). When the whole output,
stripped and optionally inside a ```json fence, is one call object or a
list of call objects, it is a bare JSON tool call (Llama 3.1 style).

Only names in the offered `tool_names` make tool calls. A block that is not
valid JSON or names an unknown tool stays in the content as plain text.

Streaming contract: for any text split in any way into `feed()` calls, the
concatenated `ContentDelta` texts of `ToolCallStream` equal exactly the
content returned by `parse_tool_calls(prefix + text)` (which is stripped at
both ends: the stream drops leading whitespace and holds trailing whitespace
until more content follows), and its calls equal the parser's calls in
order, ignoring the random ids.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_FENCE = "```"
_FENCED_JSON = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call; `arguments` is a compact JSON object string."""

    id: str
    name: str
    arguments: str


@dataclass
class ContentDelta:
    """Plain text to stream as `delta.content`."""

    text: str


@dataclass
class ToolCallDelta:
    """One complete tool call, the `index`-th of this output (from 0)."""

    index: int
    call: ToolCall


StreamEvent = ContentDelta | ToolCallDelta


def new_call_id() -> str:
    """Return a random OpenAI-style tool call id: "call_" + 24 hex chars."""
    return "call_" + secrets.token_hex(12)


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str, list[ToolCall]]:
    """Split model output into (stripped remaining content, tool calls)."""
    if not tool_names:
        return text.strip(), []
    bare = _parse_bare(text, tool_names)
    if bare is not None:
        return "", bare
    content: list[str] = []
    calls: list[ToolCall] = []
    for raw, inner in _scan_blocks(text):
        parsed = None if inner is None else _parse_block(inner, tool_names)
        if parsed is None:
            content.append(raw)
        else:
            calls.extend(parsed)
    return "".join(content).strip(), calls


def _scan_blocks(text: str) -> list[tuple[str, str | None]]:
    """Cut text into (raw, inner) pieces; inner is None for plain text."""
    pieces: list[tuple[str, str | None]] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        pieces.append((text[pos:start], None))
        inner_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, inner_start)
        if end < 0:
            pieces.append((text[start:], text[inner_start:]))
            return pieces
        pos = end + len(TOOL_CALL_CLOSE)
        pieces.append((text[start:pos], text[inner_start:end]))
    pieces.append((text[pos:], None))
    return pieces


def _parse_block(inner: str, tool_names: set[str]) -> list[ToolCall] | None:
    """Parse the inside of a block; an unterminated block may end in a partial tag."""
    body = inner.strip()
    return _parse_json_calls(body[: len(body) - _partial_suffix_length(body, TOOL_CALL_CLOSE)], tool_names)


def _parse_bare(text: str, tool_names: set[str]) -> list[ToolCall] | None:
    """Parse the whole output as bare JSON call(s), or return None."""
    body = text.strip()
    fenced = _FENCED_JSON.match(body)
    body = fenced.group(1) if fenced else body
    return _parse_json_calls(body, tool_names) if body.startswith(("{", "[")) else None


def _parse_json_calls(body: str, tool_names: set[str]) -> list[ToolCall] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return _calls_from_json(value, tool_names)


def _calls_from_json(value: Any, tool_names: set[str]) -> list[ToolCall] | None:
    """Calls from one call object or a non-empty list of them (all must be valid)."""
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_object(item, tool_names) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def _call_from_object(obj: Any, tool_names: set[str]) -> ToolCall | None:
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or name not in tool_names:
        return None
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall(id=new_call_id(), name=name, arguments=compact)


def _partial_suffix_length(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class ToolCallStream:
    """Incremental tool-call parser for streamed output (see module docstring).

    Modes: "start" (only whitespace seen yet), "text" (plain text, holding
    back a possible partial `<tool_call>`), "block" (inside a block, buffered
    until `</tool_call>`), "bare" (output may be bare JSON: buffered until
    `finish()`), "plain" (no tools offered: text passes straight through).
    """

    def __init__(self, tool_names: set[str], prefix: str = "") -> None:
        self.tool_names = set(tool_names)
        self._mode = "start" if self.tool_names else "plain"
        self._pending = ""
        self._events: list[StreamEvent] = []
        self._calls = 0
        self._started = False
        self._held_space = ""
        if prefix:
            self._pending = prefix
            self._advance(final=False)
            self._events = [e for e in self._events if isinstance(e, ToolCallDelta)]

    def feed(self, text: str) -> list[StreamEvent]:
        """Add generated text; return the events it completes."""
        self._pending += text
        self._advance(final=False)
        return self._drain()

    def finish(self) -> list[StreamEvent]:
        """End of output: resolve everything still buffered."""
        self._advance(final=True)
        pending, self._pending = self._pending, ""
        if self._mode == "bare":
            content, calls = parse_tool_calls(pending, self.tool_names)
            self._emit_text(content)
            self._emit_calls(calls)
        elif self._mode == "block":
            self._emit_block(pending, pending[len(TOOL_CALL_OPEN) :])
        else:
            self._emit_text(pending)
        return self._drain()

    def _drain(self) -> list[StreamEvent]:
        events, self._events = self._events, []
        return events

    def _advance(self, final: bool) -> None:
        while True:
            if self._mode == "start" and not self._decide_start(final):
                return
            if self._mode == "plain":
                self._emit_text(self._pending)
                self._pending = ""
                return
            if self._mode == "text" and not self._advance_text(final):
                return
            if self._mode == "block" and not self._advance_block():
                return
            if self._mode == "bare":
                return

    def _decide_start(self, final: bool) -> bool:
        """Pick "bare" or "text" from the first non-space characters."""
        stripped = self._pending.lstrip()
        undecided = not stripped or (_FENCE.startswith(stripped) and stripped != _FENCE)
        if undecided and not final:
            return False
        self._mode = "bare" if stripped.startswith(("{", "[", _FENCE)) else "text"
        return True

    def _advance_text(self, final: bool) -> bool:
        """Emit plain text; return True when a block starts."""
        start = self._pending.find(TOOL_CALL_OPEN)
        if start < 0:
            hold = 0 if final else _partial_suffix_length(self._pending, TOOL_CALL_OPEN)
            cut = len(self._pending) - hold
            self._emit_text(self._pending[:cut])
            self._pending = self._pending[cut:]
            return False
        self._emit_text(self._pending[:start])
        self._pending = self._pending[start:]
        self._mode = "block"
        return True

    def _advance_block(self) -> bool:
        """Emit a block once its closing tag arrived; return True if it did."""
        end = self._pending.find(TOOL_CALL_CLOSE, len(TOOL_CALL_OPEN))
        if end < 0:
            return False
        stop = end + len(TOOL_CALL_CLOSE)
        raw, self._pending = self._pending[:stop], self._pending[stop:]
        self._emit_block(raw, raw[len(TOOL_CALL_OPEN) : end])
        self._mode = "text"
        return True

    def _emit_block(self, raw: str, inner: str) -> None:
        calls = _parse_block(inner, self.tool_names)
        if calls is None:
            self._emit_text(raw)
        else:
            self._emit_calls(calls)

    def _emit_calls(self, calls: list[ToolCall]) -> None:
        for call in calls:
            self._events.append(ToolCallDelta(index=self._calls, call=call))
            self._calls += 1

    def _emit_text(self, text: str) -> None:
        """Emit content, dropping leading and holding trailing whitespace."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = text[len(body) :]
        if body:
            self._events.append(ContentDelta(body))
