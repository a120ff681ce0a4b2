"""Thinking over HTTP with the official openai client, on a tiny Qwen3 (Qwen3's real tokenizer and
Qwen3-8B's hybrid template) whose answer is scripted: its weights make the next token depend on the
current one alone, and follow one chain (`CHAIN`), so a think block comes back every time rather
than by luck. The answer's reasoning comes as `reasoning` and `reasoning_content`, its content
after `</think>`; `chat_template_kwargs` turns thinking off; an answer cut inside its think block
has null content; the turn keeps every sampled ID; the next request, which resends the answer
without its reasoning, still pairs with it; bad `chat_template_kwargs` are 400s."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from clawrl.store.db import Store
from clawrl.testing import scripted_qwen3
from tests.conftest import RemoteServer, vllm_args, vllm_start
from tests.timing import wait_for

OPEN, CLOSE, END = 151667, 151668, 151645  # <think>, </think>, <|im_end|>
NEWLINE = 198  # the generation prompt's last token: "<|im_start|>assistant\n"
# "<think>Let me think.</think>\n\nHello!" then the end; each token once, so a bigram can follow it.
CHAIN = [NEWLINE, OPEN, 10061, 752, 1744, 13, CLOSE, 271, 9707, 0, END]
ANSWER = CHAIN[1:]
REASONING, CONTENT = "Let me think.", "Hello!"


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, qwen3_model_dir):
    folder = scripted_qwen3(qwen3_model_dir, tmp_path_factory.mktemp("scripted-qwen3"), CHAIN)
    run_dir = tmp_path_factory.mktemp("thinking") / "run"
    server = RemoteServer(run_dir, ["--model", str(folder), "--judge.enabled", "false"])
    yield server
    server.stop()


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def recorded(server: RemoteServer, turn_id: str):
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return store.get_turn(turn_id)


def test_the_answer_comes_split_into_reasoning_and_content_and_the_turn_keeps_every_id(thinker):
    r = thinker.client().chat.completions.create(model="clawrl", messages=ask("Hi?"), temperature=0)
    message, choice = r.choices[0].message, r.choices[0]
    assert message.content == CONTENT
    assert message.model_extra["reasoning"] == message.model_extra["reasoning_content"] == REASONING
    assert choice.finish_reason == "stop" and r.usage.completion_tokens == len(ANSWER)
    assert r.usage.completion_tokens_details.reasoning_tokens == 6  # <think>, 4 tokens, </think>
    turn = recorded(thinker, r.id)
    assert turn.response_ids == ANSWER  # the think block's IDs included, as sampled
    assert (turn.response_text, turn.reasoning, turn.finish_reason) == (CONTENT, REASONING, "stop")


def test_reasoning_streams_token_by_token_before_the_content(thinker):
    stream = thinker.client().chat.completions.create(
        model="clawrl", messages=ask("Stream?"), temperature=0, stream=True
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    order = [
        ("reasoning", d.model_extra["reasoning"])
        if (d.model_extra or {}).get("reasoning")
        else ("content", d.content)
        for d in deltas
        if d.content or (d.model_extra or {}).get("reasoning")
    ]
    assert order == [("reasoning", t) for t in ("Let", " me", " think", ".")] + [
        ("content", "Hello"),
        ("content", "!"),
    ]
    both = [d.model_extra for d in deltas if (d.model_extra or {}).get("reasoning")]
    assert all(extra["reasoning_content"] == extra["reasoning"] for extra in both)


def test_enable_thinking_false_gives_content_alone(thinker):
    """Qwen3's template writes an empty think block into the prompt; the chain goes on from it."""
    r = thinker.client().chat.completions.create(
        model="clawrl",
        messages=ask("No thinking?"),
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = r.choices[0].message
    assert message.content == CONTENT and "reasoning" not in (message.model_extra or {})
    assert r.usage.completion_tokens_details is None  # no think block: usage as before
    turn = recorded(thinker, r.id)
    assert turn.response_ids == [9707, 0, END] and turn.reasoning is None
    assert turn.chat_template_kwargs == {"enable_thinking": False}
    assert turn.prompt_ids[-4:] == [OPEN, 271, CLOSE, 271]  # "<think>\n\n</think>\n\n"


def test_an_answer_cut_inside_its_think_block_has_null_content(thinker):
    client = thinker.client()
    r = client.chat.completions.create(model="clawrl", messages=ask("Cut?"), temperature=0, max_tokens=3)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and message.content is None
    assert message.model_extra["reasoning"] == message.model_extra["reasoning_content"] == "Let me"
    turn = recorded(thinker, r.id)
    assert turn.response_ids == ANSWER[:3] and turn.finish_reason == "length" and turn.response_text == ""
    stream = client.chat.completions.create(
        model="clawrl", messages=ask("Cut, streamed?"), temperature=0, max_tokens=3, stream=True
    )
    chunks = [c for c in stream if c.choices]
    assert not any(c.choices[0].delta.content for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


@pytest.mark.parametrize("resent", [{}, {"reasoning_content": REASONING}, {"reasoning": REASONING}])
def test_the_next_request_pairs_with_the_answer_whatever_it_resends_of_the_reasoning(thinker, resent):
    """OpenClaw and Qwen3's template drop the think block from the history they resend; a client
    may keep it under either name. The answer's next state is attached all the same (by inference:
    no session is named)."""
    client = thinker.client()
    opening = ask(f"Pair me {len(resent)}{''.join(resent)}")
    first = client.chat.completions.create(model="clawrl", messages=opening, temperature=0)
    answer = {"role": "assistant", "content": first.choices[0].message.content, **resent}
    reply = {"role": "user", "content": "Thanks, that was right."}
    client.chat.completions.create(model="clawrl", messages=[*opening, answer, reply], temperature=0)
    turn = wait_for(lambda: (t := recorded(thinker, first.id)) and t.next_state and t, 30, "the next state")
    assert turn.next_state == [reply] and turn.next_state_match == "history"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ("think", "chat_template_kwargs"),
        ({"enable_thinking": "false"}, "chat_template_kwargs.enable_thinking"),
        ({"enable_thinking": 1}, "chat_template_kwargs.enable_thinking"),
        ({"add_generation_prompt": False}, "chat_template_kwargs"),
    ],
)
def test_bad_chat_template_kwargs_are_a_400_naming_the_field(thinker, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        thinker.client().chat.completions.create(
            model="clawrl", messages=ask("Bad?"), extra_body={"chat_template_kwargs": kwargs}
        )
    assert caught.value.status_code == 400 and caught.value.param == param, caught.value.body


def test_other_template_variables_pass_through(thinker):
    """OpenClaw's "qwen-chat-template" thinking format sends preserve_thinking beside enable_thinking."""
    body = {
        "messages": ask("Pass?"),
        "chat_template_kwargs": {"enable_thinking": True, "preserve_thinking": True},
    }
    r = httpx.post(thinker.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["choices"][0]["message"]["reasoning"] == REASONING


@pytest.fixture(scope="module")
def vllm_thinker(tmp_path_factory, qwen3_model_dir, vllm_python):
    """The scripted Qwen3 behind a gateway on vLLM, which starts its own vLLM server for it."""
    folder = scripted_qwen3(qwen3_model_dir, tmp_path_factory.mktemp("scripted-qwen3-vllm"), CHAIN)
    run_dir = tmp_path_factory.mktemp("thinking-vllm") / "run"
    server = RemoteServer(run_dir, vllm_args(folder, *vllm_start(vllm_python)), timeout=300)
    yield server
    server.stop()


@pytest.mark.parametrize("engine", ["vllm"])  # "[vllm]": on the worker that runs the vLLM tests
def test_vllm_answers_are_split_the_same_way(vllm_thinker, engine):
    """One split for both engines: the vLLM engine yields the sampled IDs, the gateway splits them."""
    client = vllm_thinker.client()
    r = client.chat.completions.create(model="clawrl", messages=ask("Hi on vLLM?"), temperature=0)
    message = r.choices[0].message
    assert (message.content, message.model_extra["reasoning_content"]) == (CONTENT, REASONING)
    assert recorded(vllm_thinker, r.id).response_ids == ANSWER
    stream = client.chat.completions.create(
        model="clawrl", messages=ask("Stream on vLLM?"), temperature=0, stream=True
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert [d.model_extra["reasoning"] for d in deltas if (d.model_extra or {}).get("reasoning")] == [
        "Let",
        " me",
        " think",
        ".",
    ]
    assert "".join(d.content or "" for d in deltas) == CONTENT
    cut = client.chat.completions.create(
        model="clawrl", messages=ask("Cut on vLLM?"), temperature=0, max_tokens=3
    )
    assert cut.choices[0].message.content is None and cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.model_extra["reasoning"] == "Let me"
