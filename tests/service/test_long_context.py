"""A window longer than the model was trained on, and the prefix cache, through the API.

The tiny random model was trained (so to speak) on 512 positions; served with
`--model.max-context 2048` its RoPE is YaRN-scaled by 4, as the embedded model's is to 32,768.
"""

from __future__ import annotations

import re

import openai
import pytest

from tests.conftest import RemoteServer


@pytest.fixture(scope="module")
def long_server(tmp_path_factory, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--model.max-context", "2048"]
    server = RemoteServer(tmp_path_factory.mktemp("long") / "run", args)
    yield server
    server.stop()


def _ask(client, words: int, tail: str = ""):
    text = " ".join(f"w{i % 50}" for i in range(words)) + tail
    return client.chat.completions.create(
        model="clawrl", messages=[{"role": "user", "content": text}], max_tokens=4, temperature=0
    )


def test_the_scaled_window_is_reported_and_served_past_the_trained_one(long_server):
    client = long_server.client()
    assert client.models.list().data[0].model_extra["max_model_len"] == 2048
    first = _ask(client, 600)
    assert 1000 < first.usage.prompt_tokens < 2040  # past the 512 positions the model was built with
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = _ask(client, 600, " and one more question?")  # the same prefix, a new ending
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 8
    assert again.usage.prompt_tokens > first.usage.prompt_tokens
    assert long_server.health()["engine"]["extra"]["prefix_cache"]["hits"] >= 1


def test_a_prompt_over_the_window_gets_a_400_naming_both_numbers(long_server):
    with pytest.raises(openai.BadRequestError) as error:
        _ask(long_server.client(), 1500)
    body = error.value.body
    assert body["code"] == "context_length_exceeded"
    numbers = [int(n) for n in re.findall(r"\d+", body["message"])]
    assert 2048 in numbers and max(numbers) > 2048
