"""Tests for clawrl.chat.template: rendering OpenAI messages to prompt IDs."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from clawrl.chat import template as chat
from clawrl.chat.template import ChatRenderer, ChatRenderError, RenderedPrompt
from clawrl.chat.tools import parse_tool_calls

WEATHER_FN = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME_FN = {
    "name": "get_time",
    "description": "Current time.",
    "parameters": {"type": "object", "properties": {}},
}
TOOLS = [{"type": "function", "function": WEATHER_FN}, {"type": "function", "function": TIME_FN}]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"

NATIVE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

HISTORY = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
]


def template_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    result = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(result["input_ids"] if hasattr(result, "keys") else result)


def decoded(tokenizer: Any, rendered: RenderedPrompt) -> str:
    return tokenizer.decode(rendered.prompt_ids)


def test_plain_chat_matches_template_tokenization(smol_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi there! Ça va? 😀"}]
    rendered = ChatRenderer(smol_tokenizer).render(messages)
    text = smol_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.prompt_ids == smol_tokenizer.encode(text, add_special_tokens=False)
    assert rendered.prompt_ids == template_ids(smol_tokenizer, messages)
    assert rendered.prompt_text == text and text.endswith("<|im_start|>assistant\n")
    assert rendered.tool_names == set() and rendered.forced_prefix == ""


def test_supports_tools(smol_tokenizer: Any) -> None:
    assert not ChatRenderer(smol_tokenizer).supports_tools
    assert ChatRenderer(smol_tokenizer, chat_template=NATIVE_TEMPLATE).supports_tools


def test_developer_becomes_system(smol_tokenizer: Any) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = ChatRenderer(smol_tokenizer).render(messages).prompt_text
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert DEFAULT_SYSTEM not in text


def test_list_and_none_content(smol_tokenizer: Any) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    messages.append({"role": "user", "content": "again"})
    text = ChatRenderer(smol_tokenizer).render(messages).prompt_text
    assert "<|im_start|>user\nfirst\nsecond<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n" in text


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        "just a string",
    ],
)
def test_non_text_parts_are_rejected(smol_tokenizer: Any, part: Any) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(ChatRenderError, match="only text"):
        ChatRenderer(smol_tokenizer).render(messages)


def test_bad_messages_are_rejected(smol_tokenizer: Any) -> None:
    renderer = ChatRenderer(smol_tokenizer)
    with pytest.raises(ChatRenderError):
        renderer.render([])
    with pytest.raises(ChatRenderError, match="role"):
        renderer.render([{"role": "robot", "content": "beep"}])


def test_generic_tool_prompt(smol_tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "You are Claw."}, {"role": "user", "content": "Weather?"}]
    rendered = ChatRenderer(smol_tokenizer).render(messages, tools=TOOLS, tool_choice="auto")
    text = rendered.prompt_text
    assert text.startswith("<|im_start|>system\nYou are Claw.\n\n# Tools\n")
    assert json.dumps(WEATHER_FN) in text and json.dumps(TIME_FN) in text
    assert (
        '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as a JSON object>}}\n</tool_call>'
        in text
    )
    assert "<tool_response>" in text and text.count("<|im_start|>system") == 1
    assert rendered.tool_names == {"get_weather", "get_time"} and rendered.forced_prefix == ""
    assert rendered.prompt_ids == smol_tokenizer.encode(text, add_special_tokens=False)


def test_module_docstring_documents_the_exact_generic_prompt() -> None:
    example = '{"name": "get_weather", "description": "...", "parameters": {...}}'
    prompt = chat.GENERIC_TOOL_PROMPT.format(tools=example)
    assert textwrap.indent(prompt, "      ") in chat.__doc__


def test_generic_tool_prompt_without_system_message(smol_tokenizer: Any) -> None:
    rendered = ChatRenderer(smol_tokenizer).render([{"role": "user", "content": "hi"}], tools=TOOLS)
    assert rendered.prompt_text.startswith("<|im_start|>system\n# Tools\n")
    assert DEFAULT_SYSTEM not in rendered.prompt_text
    assert rendered.tool_names == {"get_weather", "get_time"}


def test_tool_choice_none_hides_tools(smol_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    rendered = ChatRenderer(smol_tokenizer).render(messages, tools=TOOLS, tool_choice="none")
    assert "# Tools" not in rendered.prompt_text and "get_weather" not in rendered.prompt_text
    assert rendered.tool_names == set()
    assert rendered.prompt_ids == template_ids(smol_tokenizer, messages)


def test_named_tool_choice_forces_prefix(smol_tokenizer: Any) -> None:
    renderer = ChatRenderer(smol_tokenizer)
    messages = [{"role": "user", "content": "Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    rendered = renderer.render(messages, tools=TOOLS, tool_choice=choice)
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
    assert rendered.forced_prefix == prefix and rendered.tool_names == {"get_weather"}
    assert decoded(smol_tokenizer, rendered).endswith("<|im_start|>assistant\n" + prefix)
    base = renderer.render(messages, tools=TOOLS).prompt_text
    assert rendered.prompt_ids == smol_tokenizer.encode(base + prefix, add_special_tokens=False)
    content, calls = parse_tool_calls(prefix + '{"city": "Paris"}}\n</tool_call>', rendered.tool_names)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city":"Paris"}')]


def test_required_tool_choice(smol_tokenizer: Any) -> None:
    rendered = ChatRenderer(smol_tokenizer).render([{"role": "user", "content": "x"}], TOOLS, "required")
    assert rendered.forced_prefix == '<tool_call>\n{"name": "'
    assert rendered.prompt_text.endswith("<|im_start|>assistant\n" + rendered.forced_prefix)
    assert decoded(smol_tokenizer, rendered) == rendered.prompt_text
    assert rendered.tool_names == {"get_weather", "get_time"}


@pytest.mark.parametrize(
    ("tools", "choice", "match"),
    [
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in tools"),
        (None, {"type": "function", "function": {"name": "get_time"}}, "not in tools"),
        (None, "required", "required"),
        ([], "required", "required"),
        (TOOLS, "sometimes", "tool_choice"),
        ([{"type": "function"}], "auto", "tool"),
    ],
)
def test_tool_choice_errors(smol_tokenizer: Any, tools: Any, choice: Any, match: str) -> None:
    with pytest.raises(ChatRenderError, match=match):
        ChatRenderer(smol_tokenizer).render([{"role": "user", "content": "x"}], tools, choice)


def test_tool_history_round_trip_generic(smol_tokenizer: Any) -> None:
    messages = [*HISTORY, {"role": "user", "content": "Thanks!"}]
    text = ChatRenderer(smol_tokenizer).render(messages, tools=TOOLS).prompt_text
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assistant = f"<|im_start|>assistant\n{weather}\n{time}<|im_end|>\n"
    responses = "<tool_response>\n18C, sunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
    assert (
        assistant + f"<|im_start|>user\n{responses}<|im_end|>\n<|im_start|>user\nThanks!<|im_end|>\n" in text
    )
    assert "<|im_start|>tool" not in text
    content, calls = parse_tool_calls(f"{weather}\n{time}", {"get_weather", "get_time"})
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"Paris"}'),
        ("get_time", "{}"),
    ]


def test_assistant_content_and_tool_calls_generic(smol_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {**HISTORY[1], "content": "Let me check."}, HISTORY[2]]
    text = ChatRenderer(smol_tokenizer).render(messages, tools=TOOLS, tool_choice="none").prompt_text
    assert '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather"' in text
    assert "# Tools" not in text


def test_native_tool_template_gets_tools_and_decoded_arguments(smol_tokenizer: Any) -> None:
    renderer = ChatRenderer(smol_tokenizer, chat_template=NATIVE_TEMPLATE)
    rendered = renderer.render(HISTORY, tools=TOOLS)
    text = rendered.prompt_text
    assert text.startswith("<|im_start|>system\nTOOLS:" + json.dumps(TOOLS[0]))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\n18C, sunny<|im_end|>\n<|im_start|>tool\n12:00<|im_end|>" in text
    assert "# Tools" not in text and rendered.tool_names == {"get_weather", "get_time"}
    assert rendered.prompt_ids == smol_tokenizer.encode(text, add_special_tokens=False)
    hidden = renderer.render(HISTORY, tools=TOOLS, tool_choice="none")
    assert "TOOLS:" not in hidden.prompt_text and hidden.tool_names == set()
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'  # input not mutated


def test_template_errors_become_render_errors(smol_tokenizer: Any) -> None:
    renderer = ChatRenderer(smol_tokenizer, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatRenderError, match="roles must alternate"):
        renderer.render([{"role": "user", "content": "x"}])


def test_an_image_in_a_tool_result_is_read_as_a_placeholder_and_kept_in_the_messages(
    smol_tokenizer: Any,
) -> None:
    """A GUI agent's screenshot comes back as a tool result's image part: accepted (the contract
    stays open for vision models), read by this text-only model as IMAGE_PLACEHOLDER."""
    from clawrl.chat.template import IMAGE_PLACEHOLDER

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Look at the screen."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "the screen:"}, image]},
    ]
    text = ChatRenderer(smol_tokenizer).render(messages).prompt_text
    assert f"the screen:\n{IMAGE_PLACEHOLDER}" in text and "base64" not in text
    assert messages[2]["content"][1] == image  # the caller's messages are not changed
    bad = [*messages[:2], {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url"}]}]
    with pytest.raises(ChatRenderError, match="needs"):
        ChatRenderer(smol_tokenizer).render(bad)
