"""Forced tool calls and response_format over HTTP, with the official openai client, on both engines:
the answer is decoded under a grammar (clawrl/chat/grammar.py), so a forced call always comes back
as a parseable call, even from the tiny random model; a bad schema is a 400."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.store.db import Store
from clawrl.train.batch import left_pad, score
from clawrl.types import Turn
from tests.conftest import BOTH_ENGINES, RemoteServer
from tests.timing import wait_for

CONVERT = {
    "name": "convert",
    "description": "Convert a distance between units.",
    "parameters": {
        "type": "object",
        "properties": {
            "value": {"type": "integer", "minimum": 0, "maximum": 1000},
            "from_unit": {"enum": ["km", "mi"]},
            "to_unit": {"enum": ["km", "mi"]},
        },
        "required": ["value", "from_unit", "to_unit"],
        "additionalProperties": False,
    },
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": f} for f in (CONVERT, WEATHER)]
ASK = [{"role": "user", "content": "How many miles is 21 km?"}]
ANSWER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "celsius": {"type": "integer", "minimum": -50, "maximum": 50},
    },
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


def check_call(call, names=("convert", "get_weather")) -> dict:
    """The call is one of the offered functions, its arguments JSON that fit its schema."""
    assert call.type == "function" and call.function.name in names
    arguments = json.loads(call.function.arguments)
    if call.function.name == "convert":
        assert set(arguments) == {"value", "from_unit", "to_unit"}
        assert 0 <= arguments["value"] <= 1000 and {arguments["from_unit"], arguments["to_unit"]} <= {
            "km",
            "mi",
        }
    else:
        assert arguments["city"] in ("Paris", "Oslo", "Lima") and set(arguments) == {"city"}
    return arguments


def recorded(server: RemoteServer, completion_id: str) -> Turn:
    def turn() -> Turn | None:
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            return store.get_turn(completion_id)

    return wait_for(turn, 30, f"turn {completion_id} in the store")


@BOTH_ENGINES
def test_required_always_makes_a_call(tiny_server):
    client = tiny_server.client()
    for seed in range(3):
        r = client.chat.completions.create(
            model="clawrl",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=120,
            seed=seed,
            temperature=1.0,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1 and not choice.message.content
        check_call(choice.message.tool_calls[0])
    assert recorded(tiny_server, r.id).grammar["kind"] == "tool_call"


@BOTH_ENGINES
def test_a_named_function_is_the_one_called(tiny_server):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = tiny_server.client().chat.completions.create(
        model="clawrl", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=120, seed=5, temperature=1.0
    )
    assert r.choices[0].finish_reason == "tool_calls"
    [call] = r.choices[0].message.tool_calls
    assert check_call(call, names=("get_weather",))["city"] in ("Paris", "Oslo", "Lima")


@BOTH_ENGINES
def test_a_streamed_forced_call_arrives_as_a_tool_call_delta(tiny_server):
    stream = tiny_server.client().chat.completions.create(
        model="clawrl", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, seed=1, stream=True
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id.startswith("call_")
    check_call(calls[0])
    assert not "".join(d.content or "" for d in deltas)  # the call's markup never leaks into the content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]


@BOTH_ENGINES
def test_response_format_json_schema_gives_parseable_content(tiny_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    r = tiny_server.client().chat.completions.create(
        model="clawrl", messages=ASK, response_format=fmt, max_tokens=60, seed=2, temperature=1.0
    )
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    assert value["city"] in ("Paris", "Oslo") and -50 <= value["celsius"] <= 50 and len(value) == 2
    assert recorded(tiny_server, r.id).grammar["kind"] == "json_schema"


@BOTH_ENGINES
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "foo",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}},
                }
            },
            "unclosed group",
        ),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
                "tool_choice": "required",
            },
            "must have type 'object'",
        ),
    ],
)
def test_a_bad_constraint_is_a_400_naming_it(tiny_server, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as caught:
        tiny_server.client().chat.completions.create(model="clawrl", messages=ASK, max_tokens=5, **kwargs)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert needle in error["message"] + str(error.get("param")), error
    # The server is still fine afterwards.
    assert tiny_server.client().chat.completions.create(model="clawrl", messages=ASK, max_tokens=2).choices


def test_switched_off_the_forced_prefix_is_back_and_nothing_is_constrained(tmp_path, tiny_model_dir):
    server = RemoteServer(
        tmp_path / "run", ["--model", str(tiny_model_dir), "--engine.constrained-decoding", "false"]
    )
    try:
        r = server.client().chat.completions.create(
            model="clawrl", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=8, seed=0
        )
        turn = recorded(server, r.id)
        assert turn.grammar is None
        text = AutoTokenizer.from_pretrained(tiny_model_dir).decode(turn.prompt_ids)
        assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')
    finally:
        server.stop()


@pytest.mark.parametrize("engine", ["vllm"], scope="module")
def test_the_trainer_replays_the_mask_vllm_decoded_under(tiny_server, embedded_model_dir, engine):
    """vLLM masks the logits before its sampler (its guidance backend: llguidance, as here), so its
    logprobs are of the masked distribution; the trainer's replay of the grammar gets the same ones."""
    r = tiny_server.client().chat.completions.create(
        model="clawrl",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        top_p=1.0,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    turn = recorded(tiny_server, r.id)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    batch = left_pad([turn.prompt_ids], [turn.response_ids], torch.device("cpu"))
    batch.grammar = [turn.grammar]
    with torch.no_grad():
        masked = score(model, batch, torch.ones(1))[0][0]
        batch.grammar, batch.masks = None, None
        free = score(model, batch, torch.ones(1))[0][0]
    recorded_logprobs = torch.tensor(turn.logprobs)
    # vLLM computes in bfloat16: about 0.1 nats from a float32 forward (tests/service/test_vllm.py).
    diff = (masked - recorded_logprobs).abs()
    assert diff.mean() < 0.06 and diff.max() < 0.35, diff.tolist()
    forced = recorded_logprobs == 0  # one allowed token: probability 1 under the mask, and not without it
    assert forced.sum() >= 5 and free[forced].sum() < -1.0, (free[forced].tolist(), turn.logprobs)
