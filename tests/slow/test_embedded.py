"""The real embedded model (SmolLM2-135M-Instruct) end to end through the server."""

from __future__ import annotations

import json
import re
import subprocess

import openai
import pytest

from clawrl.cli import main
from tests.conftest import CLAWRL, ROOT, RemoteServer
from tests.timing import limit

pytestmark = pytest.mark.slow

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
FORCE = {"type": "function", "function": {"name": "get_weather"}}
# Spelled out: asked only "What's the weather in Paris?", the 135M model (RoPE-scaled to 32k) writes the
# schema itself as the arguments and runs past any small max_tokens.
ASK_WEATHER = 'Call get_weather with {"city": "Paris"}.'


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory, embedded_model_dir):
    # No --model: the server finds the embedded model itself, as `./scripts/serve` does. The default
    # judge is on (the judge test below reads its judgments), with method combine; no trainer.
    args = ["--method", "combine", "--train.enabled", "false"]
    server = RemoteServer(tmp_path_factory.mktemp("smol") / "run", args)
    yield server
    server.stop()


def test_embedded_model_answers_a_question(smol_server):
    r = smol_server.client().chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=40,
        temperature=0,
    )
    answer = r.choices[0].message.content
    assert "Paris" in answer
    assert r.choices[0].finish_reason in {"stop", "length"}


def test_tool_call_round_trip(smol_server):
    client = smol_server.client()
    messages = [{"role": "user", "content": ASK_WEATHER}]
    first = client.chat.completions.create(
        model="clawrl", messages=messages, tools=WEATHER, tool_choice=FORCE, max_tokens=60, temperature=0
    )
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "sunny"}'},
    ]
    second = client.chat.completions.create(
        model="clawrl", messages=messages, tools=WEATHER, max_tokens=40, temperature=0
    )
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10  # the tool result is in the prompt
    assert second.choices[0].message.content or second.choices[0].message.tool_calls


def test_streamed_tool_call_matches_the_plain_one(smol_server):
    client = smol_server.client()
    kw = dict(
        model="clawrl",
        messages=[{"role": "user", "content": ASK_WEATHER}],
        tools=WEATHER,
        tool_choice=FORCE,
        max_tokens=60,
        temperature=0,
    )
    plain = client.chat.completions.create(**kw).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**kw, stream=True))
    calls = [
        tc
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for tc in c.choices[0].delta.tool_calls
    ]
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
        (i, c.function.name, c.function.arguments) for i, c in enumerate(plain)
    ]
    assert calls and calls[0].function.name == "get_weather"
    # The agent echoes the streamed call back with the tool's result. Turns with the same history and
    # answer are continued oldest first, so continuations go on until the streamed turn takes one:
    # that happens only if its recorded answer is what the client saw and echoed.
    echoed = {
        "role": "assistant",
        "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) or None,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in calls
        ],
    }
    result = {"role": "tool", "tool_call_id": calls[0].id, "content": '{"sky": "sunny"}'}
    follow = {**kw, "messages": [*kw["messages"], echoed, result], "tool_choice": "auto", "max_tokens": 4}
    out = smol_server.run_dir.parent / "turns.jsonl"
    for _ in range(4):  # older turns with this very history (earlier tests) take their turn first
        client.chat.completions.create(**follow)
        assert main(["records", "export", "--run-dir", str(smol_server.run_dir), "--out", str(out)]) == 0
        by_id = {line["id"]: line for line in (json.loads(x) for x in out.read_text().splitlines())}
        streamed = by_id[chunks[0].id]
        if streamed["next_state"] is not None:
            break
    assert streamed["next_state"] == [result]
    assert "<tool_call>" not in streamed["response"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]


REPLIES = [  # (question, the user's next message, the sign it gives the answer)
    ("What is 2+2?", "No, that's wrong. It is 4, please fix your answer.", -1),
    ("What is the capital of Australia?", "Wrong, it's Canberra, not Sydney. Try again.", -1),
    ("Write a haiku about rain.", "That's not a haiku at all, you ignored what I asked.", -1),
    ("Explain what a CPU does.", "Way too long. One sentence, no preamble.", -1),  # complaints about form
    ("List three fruits.", "The formatting is a mess, I can't read this.", -1),
    ("What is the capital of France?", "Thanks a lot, that's exactly right!", 1),
    ("Name a primary colour.", "Perfect, thank you!", 1),
    ("How many days are in a week?", "Great, that's what I needed. Thanks!", 1),
]


def test_the_default_judge_reads_corrections_and_thanks_on_the_embedded_model(smol_server):
    """The default judge (label likelihoods on the frozen base, m = 3 prompt variants, leaned by
    dissatisfaction cues) on the embedded model, end to end through the server: every vote is cast
    (none fails), corrections and complaints about an answer's form score -1 and thanks +1 on at
    least 7 of 8 turns (bench/judge.py: 96% on the labelled set's corrections, complaints and
    thanks, so one miss in eight is within what it does), and a turn judged -1 takes its next
    state as the OPD hint."""
    from tests.service.test_judge import converse, judged

    server = smol_server
    turns = [(converse(server, question, reply)[0], sign) for question, reply, sign in REPLIES]
    right = 0
    for (turn_id, sign), (_, reply, _) in zip(turns, REPLIES, strict=True):
        j, samples = judged(server, turn_id, timeout=240)
        assert j.judge == "likelihood:base"
        assert [v.kind for v in j.votes] == ["prm"] * 3 + ["hint"]
        assert all(v.value is not None and v.error is None for v in j.votes), [v.error for v in j.votes]
        right += j.score == sign
        if j.score == -1:
            assert j.hint is not None and reply in j.hint
            # combine: one, carrying r; beside it the hint rewrite (train.hint_rewrite, on by default)
            assert [(s.kind, s.reward, s.rewrite) for s in samples] == [
                ("opd", -1.0, False),
                ("opd", 0.0, True),
            ]
        else:
            assert j.hint is None
    assert right >= 7, f"{right} of 8 signs right"
    judge = server.health()["judge"]
    assert judge["failed_votes"] == 0 and judge["judged"] >= 8


def test_the_embedded_model_serves_a_32k_window(smol_server):
    """RoPE-scaled past the 8,192 tokens it was trained on (quality: bench/context.py, in docs/serving.md)."""
    client = smol_server.client()
    assert client.models.list().data[0].model_extra["max_model_len"] == 32768
    with pytest.raises(openai.BadRequestError) as error:  # rejected before any prefill
        client.chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "grey sky " * 20000}], max_tokens=8
        )
    body = error.value.body
    assert body["code"] == "context_length_exceeded"
    numbers = [int(n) for n in re.findall(r"\d+", body["message"])]
    assert 32768 in numbers and max(numbers) > 36000  # the window and the prompt's length


def test_the_embedded_model_samples_with_smollm2s_published_defaults(smol_server):
    """A client that names no temperature (OpenClaw by default) gets temperature 0.2, top_p 0.9, not
    1.0, and the capital of France is Paris in most seeded answers. (Not all: at 0.2 the 135M model
    still wanders off in about one seed of three, seen with RoPE unscaled as here.)"""
    client = smol_server.client()
    defaults = client.models.list().data[0].model_extra["sampling_defaults"]
    assert (defaults["temperature"], defaults["top_p"], defaults["top_k"]) == (0.2, 0.9, 0)
    assert defaults["source"].endswith("SmolLM2-135M-Instruct/generation_config.json")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    texts = [
        client.chat.completions.create(model="clawrl", messages=question, max_tokens=30, seed=seed)
        .choices[0]
        .message.content
        for seed in range(3)
    ]
    assert sum("Paris" in text for text in texts) >= 2, texts


def test_the_calculator_on_the_embedded_model(smol_server, tmp_path):
    """`clawrl envs eval --base-url` on a held-out calculator task (the shipped environment): the
    episode makes the forced calculate-then-submit calls and is scored 0 or 1."""
    out = tmp_path / "out"
    command = [*CLAWRL, "envs", "eval", "--env", "calculator"]
    command += ["--base-url", smol_server.url, "--limit", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=limit(900), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["reward"] in (0.0, 1.0)
    assert lines[0]["tool_calls"] == 2 and lines[0]["reason"] == "done", lines
