"""An answer split into its reasoning and its content, on token IDs, as the tokens come.

Thinking models (Qwen3, Qwen3-Thinking-2507) write `<think>` reasoning `</think>` content. When the
tokenizer has both tags as single tokens (`think_tokens`), `ReasoningSplit` tells, token by token,
which part each sampled token belongs to: the text before `</think>` is the reasoning, the text after
it the content; the tags themselves are in neither. A Thinking-2507 template opens the block in the
prompt (its generation prompt ends with `<think>\\n`), so the answer starts inside it and only has
`</think>` (`opens_thinking`). One split for every engine: both yield sampled token IDs, and the
gateway detokenises each part on its own (clawrl/api/completions.py), so a tag never depends on how
the text around it was cut into tokens.

Rules, as vLLM's Qwen3 reasoning parser has them:
* An answer whose first token is `<think>` (or whose prompt opened the block) is reasoning until
  `</think>`; everything after it is content, a later `<think>` included.
* An answer that starts with anything else is all content (Qwen3-Instruct-2507, or a hybrid Qwen3
  with `enable_thinking` false, whose template writes an empty block into the prompt).
* An answer cut (by `max_tokens`) before `</think>` has reasoning and no content.
* Tool calls are parsed from the content only (clawrl/chat/tools.py): a `<tool_call>` the model
  drafts while thinking is not a call.
* A tokenizer without the two tags (SmolLM2) gets no split: every token is content, as before.

The API sends the reasoning as both `reasoning` (vLLM's name since vllm#27752) and
`reasoning_content` (DeepSeek's, which LiteLLM and the Vercel AI SDK read), and accepts either on
an assistant message in the history (clawrl/chat/template.py passes it to the template as
`reasoning_content`, the name Qwen3's template reads).

What OpenClaw reads (2026.9.6, the version scripts/setup-openclaw installs; its provider library
@openclaw/ai, dist/openai-transport-params-*.mjs): a stream delta's reasoning is the first
non-empty string of `reasoning_content`, `reasoning`, `reasoning_text`, in that order, so the two
fields with one text are shown once. It remembers the field it came from and, for a model it
marks as reasoning whose replay it trusts, resends the reasoning under that field on the assistant
message; otherwise it strips all of them from the history it resends, and the content alone comes
back (the next request still pairs: clawrl/sessions/tracker.py). Its "qwen-chat-template" thinking
format sends `chat_template_kwargs: {enable_thinking, preserve_thinking}`; both reach the template.

`AnswerText` is the whole path from sampled IDs to the two texts: the split, a detokeniser per part,
and the request's stop strings, which cut the content only (the reasoning is the model's scratch
space; a stop string a client chose for its answer must not end the thinking).

`SpaceTrim` is each part's whitespace rule: the newline after `<think>` and the blank line after
`</think>` are the template's layout, not text, so a part drops its leading whitespace and holds its
trailing whitespace until more text follows (what `clawrl/chat/tools.py`'s stream does with content).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from clawrl.chat.text import IncrementalDetokenizer, StopStrings

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
PROMPT_TAIL = 3  # a generation prompt that opens the block ends in `<think>` and a newline or two

Part = Literal["reasoning", "content", "tag"]


@dataclass(frozen=True)
class ThinkTokens:
    """The IDs of `<think>` and `</think>` in one tokenizer."""

    open_id: int
    close_id: int


def think_tokens(tokenizer: Any) -> ThinkTokens | None:
    """The tokenizer's `<think>` and `</think>`, when each is one token (else None: no split)."""
    ids = [tokenizer.encode(tag, add_special_tokens=False) for tag in (THINK_OPEN, THINK_CLOSE)]
    if any(len(found) != 1 for found in ids):
        return None
    return ThinkTokens(ids[0][0], ids[1][0])


def opens_thinking(prompt_ids: list[int], think: ThinkTokens | None) -> bool:
    """Whether the prompt's generation prompt opened a think block the answer starts inside: a
    `<think>` among its last few tokens with no `</think>` after it (a closed, empty block is how a
    hybrid Qwen3 template turns thinking off)."""
    if think is None:
        return False
    tail = prompt_ids[-PROMPT_TAIL:]
    if think.open_id not in tail:
        return False
    last_open = len(tail) - 1 - tail[::-1].index(think.open_id)
    return think.close_id not in tail[last_open:]


def thinks(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the served model thinks by default (the model card's `reasoning`, which an agent's
    provider entry mirrors): one-token think tags, and a template that either reads
    `enable_thinking` and is not told False (Qwen3's hybrid template) or opens a think block in its
    generation prompt (Qwen3-Thinking-2507). Qwen3-Instruct-2507 has the tags and neither."""
    think = think_tokens(tokenizer)
    kwargs = template_kwargs or {}
    if think is None:
        return False
    if "enable_thinking" in str(tokenizer.chat_template or ""):
        return kwargs.get("enable_thinking") is not False
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False, **kwargs
    )
    return opens_thinking(tokenizer.encode(text, add_special_tokens=False), think)


class ReasoningSplit:
    """Which part of the answer each sampled token is: "reasoning", "content", or a "tag"."""

    def __init__(self, think: ThinkTokens | None, inside: bool = False) -> None:
        self._think = think
        self._state = "reasoning" if inside and think is not None else ("start" if think else "content")
        self.thought = self._state == "reasoning"  # whether the answer has a think block at all

    @property
    def thinking(self) -> bool:
        """Whether the next token is reasoning (the block is open)."""
        return self._state == "reasoning"

    def part(self, token_id: int) -> Part:
        """The part `token_id` belongs to; it moves the split on."""
        think = self._think
        if self._state == "content" or think is None:
            return "content"
        if self._state == "start":
            if token_id == think.open_id:
                self._state, self.thought = "reasoning", True
                return "tag"
            self._state = "content"
            return "content"
        if token_id == think.close_id:
            self._state = "content"
            return "tag"
        return "reasoning"


def split_ids(ids: list[int], think: ThinkTokens | None, inside: bool = False) -> tuple[list[int], list[int]]:
    """(reasoning IDs, content IDs) of a whole answer, the tags left out."""
    split = ReasoningSplit(think, inside)
    reasoning: list[int] = []
    content: list[int] = []
    for token_id in ids:
        part = split.part(token_id)
        if part != "tag":
            (reasoning if part == "reasoning" else content).append(token_id)
    return reasoning, content


class SpaceTrim:
    """A streamed part's text without its leading whitespace, its trailing whitespace held back until
    more text follows (so the concatenated output is the whole text `.strip()`ped)."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def feed(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return body


class AnswerText:
    """Sampled token IDs -> (reasoning, content) text deltas, as they become final.

    With no think block (or no think tokens) the content is exactly what `IncrementalDetokenizer` and
    `StopStrings` make of every token, as for any model; after a block, each part is `SpaceTrim`med.
    """

    def __init__(self, tokenizer: Any, think: ThinkTokens | None, inside: bool, stops: list[str]) -> None:
        self.split = ReasoningSplit(think, inside)
        self._reasoning = IncrementalDetokenizer(tokenizer)
        self._content = IncrementalDetokenizer(tokenizer)
        self._reasoning_trim = SpaceTrim()
        self._content_trim = SpaceTrim()
        self._stops = StopStrings(stops)
        self.stopped = False  # a stop string ended the content
        self.reasoning_tokens = 0  # the think block's tokens, its tags included (OpenAI's usage counts them)

    def add(self, token_id: int) -> tuple[str, str]:
        """One sampled token: the (reasoning, content) text it made final."""
        part = self.split.part(token_id)
        self.reasoning_tokens += part != "content"
        if part == "reasoning":
            return self._reasoning_trim.feed(self._reasoning.add(token_id)), ""
        if part == "tag":  # after `</think>`, the reasoning's last incomplete bytes are final
            return self._reasoning_trim.feed(self._reasoning.flush()), ""
        return "", self._content_text(self._content.add(token_id))

    def finish(self) -> tuple[str, str]:
        """The answer ended: the text still held back."""
        reasoning = self._reasoning_trim.feed(self._reasoning.flush())
        if self.stopped:
            return reasoning, ""
        content = self._content_text(self._content.flush())
        return reasoning, content if self.stopped else content + self._stops.flush()

    def _content_text(self, text: str) -> str:
        if self.split.thought:
            text = self._content_trim.feed(text)
        shown, self.stopped = self._stops.feed(text)
        return shown
