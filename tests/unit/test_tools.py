"""Tests for clawrl.chat.tools: full and streaming tool-call parsing."""

from __future__ import annotations

import random
import re

import pytest

from clawrl.chat.tools import (
    ContentDelta,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    parse_tool_calls,
)

NAMES = {"get_weather", "get_time"}
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "parameters": {"tz": "CET"}}\n</tool_call>'

SAMPLES = [
    f"I'll check both.\n{WEATHER}\n{TIME}\n",
    WEATHER,
    '  {"name": "get_weather", "arguments": {"city": "Paris"}}  ',
    '```json\n[{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}, {"name": "get_time"}]\n```',
    'Text <tool_call>{not json}</tool_call> after <tool_call>{"name": "get_time", "arguments": {}}'
    "</tool_call>",
    '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call> ok',
    'Sure <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n',
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_',
    "a < b and <tool> and <tool_cal x",
    "   \n  ",
    "",
    '{not a call} <tool_call>{"name":"get_time","arguments":{}}</tool_call>',
    "``` code ```",
    "`x` " + WEATHER + "\n\n  tail  \n",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich 東京 😀"}}</tool_call>',
    "</tool_call> hi",
    "<tool_call> junk " + WEATHER + " tail",
    '[{"name": "get_time"}, {"name": "unknown"}]',
    "Plain answer: 42.\n\nThat is all.\n",
    "``",
    "\n" + WEATHER + "\nThen " + TIME + " and more < text",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
]


def summary(calls: list[ToolCall]) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in calls]


def run_stream(pieces: list[str], names: set[str] = NAMES, prefix: str = "") -> list[StreamEvent]:
    stream = ToolCallStream(names, prefix=prefix)
    events: list[StreamEvent] = []
    for piece in pieces:
        events.extend(stream.feed(piece))
    return events + stream.finish()


def stream_result(events: list[StreamEvent]) -> tuple[str, list[ToolCall]]:
    content = "".join(event.text for event in events if isinstance(event, ContentDelta))
    deltas = [event for event in events if isinstance(event, ToolCallDelta)]
    assert [delta.index for delta in deltas] == list(range(len(deltas)))
    assert all(event.text for event in events if isinstance(event, ContentDelta))
    return content, [delta.call for delta in deltas]


def assert_agrees(pieces: list[str], names: set[str] = NAMES, prefix: str = "") -> None:
    expected_content, expected_calls = parse_tool_calls(prefix + "".join(pieces), names)
    content, calls = stream_result(run_stream(pieces, names, prefix))
    assert content == expected_content, pieces
    assert summary(calls) == summary(expected_calls), pieces


def test_hermes_blocks() -> None:
    content, calls = parse_tool_calls(SAMPLES[0], NAMES)
    assert content == "I'll check both."
    assert summary(calls) == [("get_weather", '{"city":"Paris"}'), ("get_time", '{"tz":"CET"}')]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in calls)
    assert calls[0].id != calls[1].id


def test_bare_json_and_fenced_list() -> None:
    assert summary(parse_tool_calls(SAMPLES[2], NAMES)[1]) == [("get_weather", '{"city":"Paris"}')]
    content, calls = parse_tool_calls(SAMPLES[3], NAMES)
    assert content == ""
    assert summary(calls) == [("get_weather", '{"city":"Rome"}'), ("get_time", "{}")]


def test_bare_json_needs_all_known_names() -> None:
    text = '[{"name": "get_time"}, {"name": "unknown"}]'
    assert parse_tool_calls(text, NAMES) == (text, [])
    assert parse_tool_calls('{"answer": 42}', NAMES) == ('{"answer": 42}', [])


def test_malformed_and_unknown_blocks_stay_text() -> None:
    content, calls = parse_tool_calls(SAMPLES[4], NAMES)
    assert content == "Text <tool_call>{not json}</tool_call> after"
    assert summary(calls) == [("get_time", "{}")]
    assert parse_tool_calls(SAMPLES[5], NAMES) == (SAMPLES[5], [])


def test_unterminated_block() -> None:
    content, calls = parse_tool_calls(SAMPLES[6], NAMES)
    assert (content, summary(calls)) == ("Sure", [("get_weather", '{"city":"Oslo"}')])
    assert summary(parse_tool_calls(SAMPLES[7], NAMES)[1]) == [("get_time", "{}")]
    truncated = SAMPLES[-1]
    assert parse_tool_calls(truncated, NAMES) == (truncated, [])


def test_unicode_arguments_are_kept() -> None:
    calls = parse_tool_calls(SAMPLES[14], NAMES)[1]
    assert calls[0].arguments == '{"city":"Zürich 東京 😀"}'


def test_no_tools_means_no_calls() -> None:
    assert parse_tool_calls(" " + WEATHER + " ", set()) == (WEATHER, [])
    assert_agrees([" " + WEATHER, " "], set())


def test_invalid_argument_shapes() -> None:
    for arguments in ['"not json', "[1, 2]", "3"]:
        block = '<tool_call>{"name": "get_time", "arguments": ' + arguments + "}</tool_call>"
        assert parse_tool_calls(block, NAMES)[1] == []


@pytest.mark.parametrize("text", SAMPLES)
def test_stream_agrees_for_every_split_point(text: str) -> None:
    assert_agrees([text])
    assert_agrees(list(text))
    for cut in range(len(text) + 1):
        assert_agrees([text[:cut], text[cut:]])


@pytest.mark.parametrize("text", SAMPLES)
def test_stream_agrees_for_random_splits(text: str) -> None:
    rng = random.Random(text)
    for _ in range(100):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(1, 8))))
        assert_agrees([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])


def test_stream_emits_plain_text_early_and_buffers_blocks() -> None:
    stream = ToolCallStream(NAMES)
    assert stream.feed("Hello wor") == [ContentDelta("Hello wor")]
    assert stream.feed("ld <tool") == [ContentDelta("ld")]
    assert stream.feed('_call>\n{"name": "get_time", ') == []
    events = stream.feed('"arguments": {}}\n</tool_call>\nBye')
    assert [type(event) for event in events] == [ToolCallDelta, ContentDelta]
    assert events[0].index == 0 and events[0].call.name == "get_time"
    assert events[1] == ContentDelta(" \nBye")  # held whitespace is released with "Bye"
    assert stream.finish() == []


def test_stream_buffers_possible_bare_json_until_finish() -> None:
    stream = ToolCallStream(NAMES)
    assert stream.feed('  {"name": "get_time",') == []
    assert stream.feed(' "arguments": {}}') == []
    events = stream.finish()
    assert len(events) == 1 and isinstance(events[0], ToolCallDelta)


def test_stream_bare_json_that_is_not_a_call_becomes_content() -> None:
    events = run_stream(['{"answer"', ": 42}\n"])
    assert events == [ContentDelta('{"answer": 42}')]


def test_forced_prefix_named_function() -> None:
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
    for generated in ['{"city": "Paris"}}\n</tool_call>', '{"city": "Paris"}}']:
        events = run_stream([generated[:5], generated[5:]], prefix=prefix)
        assert len(events) == 1 and isinstance(events[0], ToolCallDelta)
        assert summary([events[0].call]) == [("get_weather", '{"city":"Paris"}')]
        for cut in range(len(generated) + 1):
            assert_agrees([generated[:cut], generated[cut:]], prefix=prefix)


def test_forced_prefix_required_and_failure_becomes_content() -> None:
    prefix = '<tool_call>\n{"name": "'
    assert_agrees(['get_time", "arguments": {}}\n</tool_call>'], prefix=prefix)
    events = run_stream(["oops"], prefix=prefix)
    assert events == [ContentDelta('<tool_call>\n{"name": "oops')]
