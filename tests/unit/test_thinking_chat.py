"""The gateway's chat service on a thinking model (clawrl/api/completions.py with
clawrl/chat/reasoning.py): Qwen3's real tokenizer and template, and a scripted engine that yields
the token IDs each test writes. A call the model drafts while thinking is no call; one after
`</think>` is, streamed or not; a prompt that opened the block (Qwen3-Thinking-2507's template)
makes the answer start inside it; a grammar makes the whole answer content."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from clawrl.api.completions import ChatService
from clawrl.api.schemas import ChatCompletionRequest
from clawrl.engine.base import EngineStats, SamplingParams, TokenEvent
from clawrl.model.sampling import SamplingDefaults

OPEN, CLOSE, END = 151667, 151668, 151645
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


class ScriptedEngine:
    """An engine that answers every request with the same token IDs (the last one finishes it)."""

    constrained_decoding = False
    processed_logprobs = False
    sampling_defaults = SamplingDefaults()
    stop_token_ids = [END]
    version = "v0"
    max_context = 4096

    def __init__(self, ids: list[int], finish: str = "stop") -> None:
        self.ids, self.finish = ids, finish
        self.prompts: list[list[int]] = []

    def stats(self) -> EngineStats:
        return EngineStats()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        self.prompts.append(prompt_ids)
        for i, token in enumerate(self.ids):
            last = i == len(self.ids) - 1
            yield TokenEvent(token, -0.5, "v0", finish_reason=self.finish if last else None)


@pytest.fixture(scope="module")
def qwen3(qwen3_model_dir) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_model_dir)


def ids(tok: Any, *parts: str | int) -> list[int]:
    """Token IDs from text pieces (encoded as the model would write them) and single IDs."""
    out: list[int] = []
    for part in parts:
        out += [part] if isinstance(part, int) else tok.encode(part, add_special_tokens=False)
    return out


def serve(tok: Any, answer: list[int], stream: bool = False, finish: str = "stop", **body: Any):
    engine = ScriptedEngine(answer, finish)
    chat = ChatService(engine, tok, "clawrl", 64)  # type: ignore[arg-type]
    prep = chat.prepare(ChatCompletionRequest(messages=body.pop("messages", ASK), **body))

    async def run() -> Any:
        if not stream:
            return await chat.complete(prep)
        return [chunk async for chunk in chat.stream(prep)]

    return asyncio.run(run()), engine


def deltas(chunks: list[str]) -> list[dict]:
    bodies = [json.loads(c.removeprefix("data: ")) for c in chunks if c.startswith("data: {")]
    return [b["choices"][0]["delta"] for b in bodies if b["choices"]]


DRAFT = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_call_drafted_while_thinking_is_no_call_and_the_one_after_is(qwen3):
    answer = ids(qwen3, OPEN, "\nI could ask " + DRAFT + " first.\n", CLOSE, "\n\n" + CALL, END)
    body, _ = serve(qwen3, answer, tools=[WEATHER, TIME])
    message = body["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    assert message["reasoning"] == message["reasoning_content"] == "I could ask " + DRAFT + " first."

    chunks, _ = serve(qwen3, answer, stream=True, tools=[WEATHER, TIME])
    streamed = deltas(chunks)
    calls = [d["tool_calls"][0]["function"]["name"] for d in streamed if d.get("tool_calls")]
    assert calls == ["get_weather"] and not any(d.get("content") for d in streamed)
    reasoning = "".join(d.get("reasoning", "") for d in streamed)
    assert reasoning == message["reasoning"] and len([d for d in streamed if d.get("reasoning")]) > 5


def test_a_call_only_inside_the_think_block_leaves_a_plain_answer(qwen3):
    answer = ids(qwen3, OPEN, DRAFT, CLOSE, "\n\nIt is sunny.", END)
    body, _ = serve(qwen3, answer, tools=[TIME])
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == "It is sunny."
    assert body["choices"][0]["finish_reason"] == "stop" and message["reasoning"] == DRAFT


def test_a_prompt_that_opened_the_block_makes_the_answer_start_inside_it(qwen3):
    """Qwen3-Thinking-2507's template ends its generation prompt with "<think>\\n"."""
    thinking = qwen3.chat_template.replace(
        "'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'"
    )
    assert thinking != qwen3.chat_template
    original, qwen3.chat_template = qwen3.chat_template, thinking
    try:
        body, engine = serve(qwen3, ids(qwen3, "Sunny, I guess.", CLOSE, "\n\nSunny.", END))
    finally:
        qwen3.chat_template = original
    assert engine.prompts[0][-2:] == [OPEN, 198]
    message = body["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Sunny, I guess.", "Sunny.")


def test_cut_inside_the_block_the_content_is_null_and_the_reasoning_what_was_written(qwen3):
    body, _ = serve(qwen3, ids(qwen3, OPEN, "\nHmm, Paris in", " spring"), finish="length", max_tokens=5)
    message = body["choices"][0]["message"]
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "length"
    assert message["reasoning"] == message["reasoning_content"] == "Hmm, Paris in spring"


def test_an_answer_without_a_block_is_content_as_before(qwen3):
    body, _ = serve(qwen3, ids(qwen3, "Sunny.\n", END), chat_template_kwargs={"enable_thinking": False})
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Sunny.\n"}  # untrimmed, no reasoning fields


def test_the_history_reasoning_reaches_the_template_under_either_name(qwen3):
    """Qwen3's template shows an assistant message's `reasoning_content` in a tool loop (after the
    last user message); `reasoning` is taken as the same."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    for name in ("reasoning", "reasoning_content"):
        history = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call], name: "Need the time first."},
            {"role": "tool", "tool_call_id": "c1", "content": "noon"},
        ]
        _, engine = serve(qwen3, ids(qwen3, "Noon.", END), messages=history, tools=[TIME])
        prompt = qwen3.decode(engine.prompts[0])
        assert "<think>\nNeed the time first.\n</think>" in prompt, name


def test_template_variables_the_servers_defaults_then_the_requests(qwen3):
    from clawrl.chat.template import ChatRenderer, ChatRenderError

    renderer = ChatRenderer(qwen3, template_kwargs={"enable_thinking": False})
    off = renderer.render(ASK)
    assert off.prompt_ids[-4:] == [OPEN, 271, CLOSE, 271] and off.template_kwargs == {
        "enable_thinking": False
    }
    on = renderer.render(ASK, template_kwargs={"enable_thinking": True, "preserve_thinking": True})
    assert on.prompt_text.endswith("<|im_start|>assistant\n")
    assert on.template_kwargs == {"enable_thinking": True, "preserve_thinking": True}
    for bad in ({"enable_thinking": "yes"}, {"tokenize": True}, {"continue_final_message": True}):
        with pytest.raises(ChatRenderError):
            renderer.render(ASK, template_kwargs=bad)


def test_the_config_default_is_checked_as_a_requests_are():
    from pydantic import ValidationError

    from clawrl.config import Config

    assert Config(model={"chat_template_kwargs": {"enable_thinking": False}}).model.chat_template_kwargs == {
        "enable_thinking": False
    }
    for bad in ({"enable_thinking": "false"}, {"add_generation_prompt": False}):
        with pytest.raises(ValidationError, match="chat_template_kwargs"):
            Config(model={"chat_template_kwargs": bad})


def test_the_teacher_prompt_renders_with_the_turns_template_variables(qwen3):
    """A turn served with thinking off keeps its empty think block in the teacher's prompt, so the
    two prompts still differ only by the hint."""
    from clawrl.algo.teacher import teacher_prompt
    from clawrl.chat.template import ChatRenderer
    from clawrl.testing import make_turn

    renderer = ChatRenderer(qwen3)
    served = renderer.render(ASK, template_kwargs={"enable_thinking": False})
    turn = make_turn(
        messages=ASK,
        tools=None,
        prompt_ids=served.prompt_ids,
        chat_template_kwargs={"enable_thinking": False},
    )
    teacher = teacher_prompt(renderer)(turn, "Say the temperature.")
    assert teacher[-4:] == [OPEN, 271, CLOSE, 271] and len(teacher) > len(served.prompt_ids)
