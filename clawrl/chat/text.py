"""Streaming text helpers: incremental detokenization and stop strings.

`IncrementalDetokenizer` turns generated token IDs into text one token at a
time (the prefix/read offset technique of vLLM and TGI): each step decodes a
short window of recent tokens twice and emits the difference, holding back
text that ends in an incomplete UTF-8 sequence ("\\ufffd") until a later
token completes it. Special tokens are never part of the output.

`StopStrings` cuts streamed text at the first OpenAI-style stop string,
holding back any tail that could still grow into one.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"
MAX_STOP_STRINGS = 4


class IncrementalDetokenizer:
    """Turn a stream of token IDs into a stream of printable text deltas.

    The concatenation of all `add()` results plus `flush()` equals
    `tokenizer.decode(all_ids, skip_special_tokens=True)`. Each step decodes
    only the tokens since the last emitted boundary, so the cost per token
    is bounded by that window, not by the length of the whole text.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._special_ids = frozenset(tokenizer.all_special_ids)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def token_ids(self) -> list[int]:
        """Non-special token IDs added so far (a copy)."""
        return list(self._ids)

    def add(self, token_id: int) -> str:
        """Append one token and return the text that became printable."""
        if token_id in self._special_ids:
            return ""
        self._ids.append(token_id)
        prefix_text, new_text = self._decode_window()
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return the text still held back (e.g. an incomplete character)."""
        prefix_text, new_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode_window(self) -> tuple[str, str]:
        window = self._ids[self._prefix_offset :]
        split = self._read_offset - self._prefix_offset
        prefix_text = self._decode(window[:split]) if split else ""
        return prefix_text, self._decode(window)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


class StopStrings:
    """Cut streamed text at the first occurrence of any stop string.

    `feed()` returns the text that is safe to emit now; a tail that could
    be the beginning of a stop string is held back until it is decided.
    Once a stop string is found, the text before it is returned with
    `stopped=True` and everything after it is dropped.
    """

    def __init__(self, stops: list[str] | None = None) -> None:
        self.stops = [stop for stop in (stops or []) if stop]
        if len(self.stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        self._max_hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._buffer = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, whether a stop was hit)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buffer = self._buffer + text
        index = self._first_stop(buffer)
        if index is not None:
            self._buffer = ""
            self.stopped = True
            return buffer[:index], True
        hold = self._hold_length(buffer)
        self._buffer = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        """Return the held-back tail when generation ended without a stop."""
        tail, self._buffer = self._buffer, ""
        return "" if self.stopped else tail

    def _first_stop(self, buffer: str) -> int | None:
        found = [buffer.find(stop) for stop in self.stops]
        hits = [index for index in found if index >= 0]
        return min(hits) if hits else None

    def _hold_length(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that starts a stop string."""
        for length in range(min(len(buffer), self._max_hold), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0
