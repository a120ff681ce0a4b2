"""The chat completions API over HTTP, with the official openai client, on both engines: a tiny
random model on the local engine, and the embedded model on vLLM behind the same gateway."""

from __future__ import annotations

import asyncio
import http.client
import json
import time

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.conftest import BOTH_ENGINES
from tests.timing import limit, wait_for

USER = [{"role": "user", "content": "Say something."}]
pytestmark = BOTH_ENGINES


def test_plain_chat_reports_exact_usage(tiny_server, tiny_model_dir):
    client = tiny_server.client()
    r = client.chat.completions.create(
        model="clawrl", messages=USER, max_tokens=7, extra_body={"ignore_eos": True}
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == "clawrl"
    assert r.system_fingerprint == "clawrl-v0"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_stream_sends_tokens_as_they_are_made(tiny_server):
    client = tiny_server.client()
    stream = client.chat.completions.create(
        model="clawrl",
        messages=USER,
        max_tokens=12,
        stream=True,
        seed=3,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(content) >= 6, "tokens must arrive in several chunks, not one at the end"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    # The stream carries the same text a non-streamed request with the same seed gets.
    full = client.chat.completions.create(
        model="clawrl", messages=USER, max_tokens=12, seed=3, extra_body={"ignore_eos": True}
    )
    assert "".join(c.choices[0].delta.content for c in content) == full.choices[0].message.content


def test_logprobs_are_negative_and_ranked(tiny_server):
    r = tiny_server.client().chat.completions.create(
        model="clawrl",
        messages=USER,
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    items = r.choices[0].logprobs.content
    assert len(items) == 5
    for item in items:
        assert item.logprob <= 0
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert item.logprob <= tops[0] + 1e-5


def test_greedy_and_seeded_sampling_repeat(tiny_server):
    client = tiny_server.client()

    def text(**kw):
        r = client.chat.completions.create(
            model="clawrl", messages=USER, max_tokens=10, extra_body={"ignore_eos": True}, **kw
        )
        return r.choices[0].message.content

    assert text(temperature=0) == text(temperature=0) == text(top_p=0.0, seed=1)
    assert text(seed=11) == text(seed=11)
    assert len({text(seed=s) for s in range(4)}) > 1


def test_stop_string_cuts_the_answer(tiny_server):
    client = tiny_server.client()
    base = (
        client.chat.completions.create(
            model="clawrl", messages=USER, max_tokens=30, seed=5, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .message.content
    )
    stop = base[len(base) // 2 : len(base) // 2 + 3]
    assert stop.strip(), base
    r = client.chat.completions.create(
        model="clawrl", messages=USER, max_tokens=30, seed=5, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert r.choices[0].message.content == base[: base.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30


def test_message_forms_and_session_fields_are_accepted(tiny_server):
    client = tiny_server.client()
    r = client.chat.completions.create(
        model="clawrl",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}],
            },
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Again."},
        ],
        max_tokens=3,
        extra_body={"session_id": "s-1", "turn_type": "main", "session_done": False, "some_new_field": 1},
        extra_headers={"X-Session-Id": "s-1", "X-Turn-Type": "main", "X-Session-Done": "false"},
    )
    assert r.choices[0].message.role == "assistant"


def test_models_and_health(tiny_server):
    models = tiny_server.client().models.list()
    assert [m.id for m in models.data] == ["clawrl"]
    health = tiny_server.health()
    assert health["status"] == "ok" and health["version"] == "v0"
    written = json.loads((tiny_server.run_dir / "config.json").read_text())
    assert written["server"]["port"] == tiny_server.port


def test_an_idle_pooled_connection_is_still_served(tiny_server):
    """Clients pool connections and reuse them after seconds of quiet (httpx keeps one 5 s, the
    OpenAI SDK's httpx too): a server that closes an idle connection at the same moment races the
    client's next request on it (`clawrl envs train` once died of that ReadError on a health
    poll). The server keeps idle connections well past the clients' pool expiry."""

    conn = http.client.HTTPConnection("127.0.0.1", tiny_server.port, timeout=limit(30))
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert first.status == 200 and first.getheader("connection", "keep-alive") != "close"
        first.read()
        local = conn.sock.getsockname()
        time.sleep(6.0)  # past uvicorn's default keep-alive (5 s): the property under test is a timeout
        conn.request("GET", "/healthz")
        again = conn.getresponse()
        assert again.status == 200 and conn.sock.getsockname() == local, "the same connection"
    finally:
        conn.close()


def test_concurrent_requests_are_decoded_together(tiny_server):
    before = tiny_server.engine_counters()

    async def run():
        client = tiny_server.async_client()
        return await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="clawrl",
                    messages=[{"role": "user", "content": f"n{i}"}],
                    max_tokens=16,
                    extra_body={"ignore_eos": True},
                )
                for i in range(8)
            ]
        )

    results = asyncio.run(run())
    assert [r.usage.completion_tokens for r in results] == [16] * 8
    after = tiny_server.engine_counters()
    steps = after["steps"] - before["steps"]
    tokens = after["tokens_generated"] - before["tokens_generated"]
    assert tokens == 128
    assert steps <= tokens / 3, f"{steps} decoding steps for {tokens} tokens: requests were not batched"


def _wait_idle(server, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine = server.engine_counters()
        if engine["active"] == 0 and engine["waiting"] == 0:
            return engine
        time.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine}")


def test_stream_disconnect_stops_generation(tiny_server):
    before = _wait_idle(tiny_server)
    body = {"model": "clawrl", "messages": USER, "max_tokens": 400, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", tiny_server.url + "/v1/chat/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        for _ in range(5):
            next(lines)
    after = _wait_idle(tiny_server)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["tokens_generated"] - before["tokens_generated"] < 300


def test_non_stream_disconnect_stops_generation(tiny_server):
    """The client hangs up once its request is being decoded (a client leaving before that, as a
    fixed 0.2 s timeout did on a loaded CI machine, never reaches the engine at all)."""

    before = _wait_idle(tiny_server)
    body = {"model": "clawrl", "messages": USER, "max_tokens": 470, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", tiny_server.port, timeout=limit(30))
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        wait_for(lambda: tiny_server.engine_counters()["active"] >= 1, 60, "the request being decoded")
    finally:
        conn.close()  # no answer read: the client is gone
    after = _wait_idle(tiny_server)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["tokens_generated"] - before["tokens_generated"] < 470


BAD_BODIES = [
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user"}]}, "content"),
    ({"messages": "hello"}, "messages"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "temperature": 3}, "temperature"),
    ({"messages": USER, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": USER, "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"messages": USER, "presence_penalty": "lots"}, "presence_penalty"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "image",
    ),
    ({"messages": [{"role": "user", "content": "hi " * 600}]}, "context length"),
    ({"messages": USER, "max_tokens": 5000}, "context length"),
    ({"messages": USER, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"messages": USER, "chat_template_kwargs": "think"}, "chat_template_kwargs"),
    ({"messages": USER, "chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"messages": USER, "chat_template_kwargs": {"enable_thinking": "no"}}, "enable_thinking"),
    ({"messages": USER, "chat_template_kwargs": {"enable_thinking": 0}}, "enable_thinking"),
    ({"messages": USER, "chat_template_kwargs": {"tokenize": True}}, "tokenize"),
    (
        {"messages": [*USER, {"role": "assistant", "content": "a", "reasoning_content": 5}]},
        "reasoning_content",
    ),
    ({"messages": [*USER, {"role": "assistant", "content": "a", "reasoning": ["x"]}]}, "reasoning"),
]


@pytest.mark.parametrize(("body", "needle"), BAD_BODIES)
def test_bad_input_gets_a_400_naming_the_problem(tiny_server, body, needle):
    r = httpx.post(tiny_server.url + "/v1/chat/completions", json={"model": "clawrl", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"] + str(error["param"])


def test_malformed_json_and_unknown_model(tiny_server):
    r = httpx.post(
        tiny_server.url + "/v1/chat/completions",
        content=b'{"messages": [',
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        tiny_server.client().chat.completions.create(model="gpt-4", messages=USER, max_tokens=2)
    # After all of that the server still answers.
    assert tiny_server.client().chat.completions.create(model="clawrl", messages=USER, max_tokens=2).choices


def test_a_tool_result_may_carry_an_image_and_the_turn_keeps_it(tiny_server):
    """The contract stays open for GUI agents: a screenshot in a tool result is accepted and stored
    with the turn as sent (a text-only model reads a placeholder); an image from the user is a 400."""
    from clawrl.store.db import Store
    from tests.timing import wait_for

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    tool = {
        "type": "function",
        "function": {"name": "screenshot", "description": "Take one.", "parameters": {}},
    }
    messages = [
        {"role": "user", "content": "What is on the screen?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "screen:"}, image]},
    ]
    r = tiny_server.client().chat.completions.create(
        model="clawrl", messages=messages, tools=[tool], max_tokens=4
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")

    def recorded():
        with Store.open(tiny_server.run_dir / "clawrl.db", readonly=True) as store:
            return next((t for t in store.turns() if t.id == r.id), None)

    turn = wait_for(recorded, 30, "the recorded turn")
    assert turn.messages[2]["content"] == [{"type": "text", "text": "screen:"}, image]
