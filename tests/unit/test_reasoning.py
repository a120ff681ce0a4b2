"""An answer split into reasoning and content on its token IDs (clawrl/chat/reasoning.py): whole and
streamed, an answer the prompt opened, one cut inside its think block, a tokenizer without think
tokens, and tool calls parsed from the content only. A small hand-written tokenizer (Qwen3's IDs for
the tags, one token per word) keeps the sequences readable."""

from __future__ import annotations

import pytest

from clawrl.chat.reasoning import (
    AnswerText,
    ReasoningSplit,
    SpaceTrim,
    ThinkTokens,
    opens_thinking,
    split_ids,
    think_tokens,
)
from clawrl.chat.tools import ContentDelta, ToolCallStream, parse_tool_calls

OPEN, CLOSE, END = 151667, 151668, 151645  # Qwen3's <think>, </think>, <|im_end|>
THINK = ThinkTokens(OPEN, CLOSE)


class WordTokenizer:
    """One token per piece of text; the tags as Qwen3 has them (not special), <|im_end|> special."""

    def __init__(self, pieces: list[str], think: bool = True) -> None:
        tags = {OPEN: "<think>", CLOSE: "</think>"} if think else {}
        self.vocab = {**dict(enumerate(pieces)), **tags, END: "<|im_end|>"}
        self.ids = {text: i for i, text in self.vocab.items()}
        self.all_special_ids = [END]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text in self.ids:
            return [self.ids[text]]
        return [self.ids[ch] for ch in text]  # a tag it lacks: spelt out (a KeyError if it cannot be)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.vocab[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def tokens(self, *texts: str) -> list[int]:
        return [self.ids[text] for text in texts]


PIECES = [
    "\n",
    "\n\n",
    "Let",
    " me",
    " think",
    ".",
    "Hi",
    " there",
    "!",
    "<tool_call>",
    '{"name": "f"}',
    "</tool_call>",
]
PIECES += list("<>/thinkg")


@pytest.fixture
def tok() -> WordTokenizer:
    return WordTokenizer(PIECES)


def test_think_tokens_are_found_only_when_each_tag_is_one_token(tok):
    assert think_tokens(tok) == THINK
    assert think_tokens(WordTokenizer(PIECES, think=False)) is None  # spelt in pieces: no split


def test_the_ids_split_at_the_tags_which_are_in_neither_part(tok):
    ids = [
        OPEN,
        *tok.tokens("\n", "Let", " me", " think", ".", "\n"),
        CLOSE,
        *tok.tokens("\n\n", "Hi", "!"),
        END,
    ]
    reasoning, content = split_ids(ids, THINK)
    assert tok.decode(reasoning) == "\nLet me think.\n"
    assert tok.decode(content, skip_special_tokens=True) == "\n\nHi!"


def test_an_answer_that_starts_otherwise_is_all_content_a_later_think_tag_included(tok):
    ids = [*tok.tokens("Hi"), OPEN, *tok.tokens(" there"), CLOSE]
    assert split_ids(ids, THINK) == ([], ids)
    assert split_ids(ids, None) == ([], ids)  # no think tokens: every token is content


def test_the_prompt_opens_the_block_when_it_ends_in_an_unclosed_think_tag():
    generation = [END, 198, 151644, 77091, 198]  # ... <|im_end|>\n<|im_start|>assistant\n
    assert opens_thinking([*generation, OPEN, 198], THINK)  # Thinking-2507: "<think>\n"
    assert not opens_thinking([*generation, OPEN, 271, CLOSE, 271], THINK)  # enable_thinking false
    assert not opens_thinking(generation, THINK)  # the hybrid's default: the model opens it
    assert not opens_thinking([OPEN, 198, *generation], THINK)  # a tag far back is no generation prompt
    assert not opens_thinking([*generation, OPEN, 198], None)


def test_an_answer_the_prompt_opened_is_reasoning_until_the_close_tag(tok):
    ids = [*tok.tokens("Let", " me", " think", "."), CLOSE, *tok.tokens("\n\n", "Hi")]
    reasoning, content = split_ids(ids, THINK, inside=True)
    assert tok.decode(reasoning) == "Let me think." and tok.decode(content) == "\n\nHi"
    split = ReasoningSplit(THINK, inside=True)
    assert split.thinking and split.thought


def stream(tok: WordTokenizer, ids: list[int], inside: bool = False, stops: list[str] | None = None):
    """AnswerText fed token by token, as the gateway does: the deltas, then the whole texts."""
    text = AnswerText(tok, think_tokens(tok), inside, stops or [])
    deltas = [text.add(i) for i in ids] + [text.finish()]
    reasoning = [r for r, _ in deltas if r]
    content = [c for _, c in deltas if c]
    return reasoning, content, text


def test_reasoning_streams_token_by_token_then_the_content_each_trimmed(tok):
    ids = [
        OPEN,
        *tok.tokens("\n", "Let", " me", " think", ".", "\n"),
        CLOSE,
        *tok.tokens("\n\n", "Hi", "!"),
        END,
    ]
    reasoning, content, text = stream(tok, ids)
    assert reasoning == ["Let", " me", " think", "."]  # one delta per token, the layout's newlines out
    assert text.reasoning_tokens == 8  # the tags and the six tokens between
    assert content == ["Hi", "!"]


def test_an_answer_cut_inside_its_think_block_has_reasoning_and_no_content(tok):
    ids = [OPEN, *tok.tokens("\n", "Let", " me", " think")]  # max_tokens: no </think>, no end token
    reasoning, content, text = stream(tok, ids)
    assert "".join(reasoning) == "Let me think" and content == []
    assert text.split.thinking  # still inside when it was cut


def test_stop_strings_cut_the_content_only(tok):
    ids = [OPEN, *tok.tokens("Let", "!", " me"), CLOSE, *tok.tokens("Hi", "!", " there")]
    reasoning, content, text = stream(tok, ids, stops=["!"])
    assert "".join(reasoning) == "Let! me"  # the thinking is not ended by the client's stop string
    assert "".join(content) == "Hi" and text.stopped


def test_without_think_tokens_the_text_is_exactly_the_detokenisers(tok):
    plain = WordTokenizer(PIECES, think=False)
    ids = plain.tokens("\n", "Hi", " there", "\n\n")
    reasoning, content, _ = stream(plain, ids)
    assert reasoning == [] and "".join(content) == "\nHi there\n\n"  # untrimmed, as before


def test_space_trim_drops_leading_and_holds_trailing_whitespace():
    trim = SpaceTrim()
    assert [trim.feed(t) for t in ["\n", " a", " ", "\n", "b", "\n"]] == ["", "a", "", "", " \nb", ""]


TOOLS = {"f"}


def test_a_tool_call_drafted_while_thinking_is_no_call_one_after_it_is(tok):
    call = ("<tool_call>", '{"name": "f"}', "</tool_call>")
    ids = [OPEN, *tok.tokens("Let", *call), CLOSE, *tok.tokens("\n\n", "Hi", *call)]
    reasoning, content, _ = stream(tok, ids)
    assert "".join(reasoning) == 'Let<tool_call>{"name": "f"}</tool_call>'  # kept as text
    text, calls = parse_tool_calls("".join(content), TOOLS)
    assert text == "Hi" and [c.name for c in calls] == ["f"]
    events = ToolCallStream(TOOLS)
    streamed = [e for piece in content for e in events.feed(piece)] + events.finish()
    assert [e.text for e in streamed if isinstance(e, ContentDelta)] == ["Hi"]
    assert len(streamed) == 2


def test_a_tool_call_only_inside_the_think_block_gives_no_call(tok):
    ids = [OPEN, *tok.tokens("<tool_call>", '{"name": "f"}', "</tool_call>"), CLOSE, *tok.tokens("Hi")]
    _, content, _ = stream(tok, ids)
    assert parse_tool_calls("".join(content), TOOLS) == ("Hi", [])
