"""A request that names no temperature, top_p or top_k samples with the model's own defaults.

Local engine: a copy of the tiny model whose generation_config.json says greedy (temperature 0)
and top_k 5. vLLM: the embedded SmolLM2, which ships its published sampling (0.2, top_p 0.9).
Either way GET /v1/models says what the defaults are, the turn records the temperature it was
sampled at, and a request that names its own keeps them.
"""

from __future__ import annotations

import json
import shutil

import pytest

from clawrl.model.load import EMBEDDED_SAMPLING
from clawrl.store.db import Store
from tests.conftest import BOTH_ENGINES, RemoteServer, attach_gateway

pytestmark = BOTH_ENGINES
ASK = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def server(request, engine, tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp(f"defaults-{engine}") / "run"
    if engine == "vllm":
        vllm = request.getfixturevalue("vllm_gateway")
        server = attach_gateway(run_dir, vllm, request.getfixturevalue("embedded_model_dir"))
        guard = {k: EMBEDDED_SAMPLING[k] for k in ("presence_penalty", "frequency_penalty")}
        expected = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, **guard}  # and the repetition guard
    else:
        folder = tmp_path_factory.mktemp("greedy-model") / "model"
        shutil.copytree(tiny_model_dir, folder)
        config = json.loads((folder / "generation_config.json").read_text())
        (folder / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.0, "top_k": 5}))
        server = RemoteServer(run_dir, ["--model", str(folder)])
        expected = {"temperature": 0.0, "top_p": 1.0, "top_k": 5, "presence_penalty": 0.0}
    yield server, expected
    server.stop()


def _recorded_temperature(server, response_id: str) -> float:
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        turn = store.get_turn(response_id)
    assert turn is not None
    return turn.temperature


def test_the_model_card_says_what_an_unset_request_samples_with(server):
    server, expected = server
    card = server.client().models.list().data[0].model_dump()
    defaults = card["sampling_defaults"]
    assert {k: defaults[k] for k in expected} == expected
    assert defaults["source"].endswith("generation_config.json")


def test_a_request_naming_none_gets_the_defaults_and_one_naming_them_keeps_its_own(server):
    server, expected = server
    client = server.client()
    plain = [client.chat.completions.create(model="clawrl", messages=ASK, max_tokens=12) for _ in range(2)]
    assert all(_recorded_temperature(server, r.id) == expected["temperature"] for r in plain)
    if expected["temperature"] == 0.0:  # greedy by default: the same answer twice
        assert plain[0].choices[0].message.content == plain[1].choices[0].message.content
    own = client.chat.completions.create(
        model="clawrl", messages=ASK, max_tokens=12, temperature=1.0, top_p=1.0
    )
    assert _recorded_temperature(server, own.id) == 1.0


def test_a_presence_penalty_stops_a_greedy_loop_and_zero_turns_it_off(server):
    """Greedy (the tiny model's default here) loops on a few tokens; with presence_penalty 2 no
    token of the answer comes twice; the recorded logprobs stay the model's own (the trainer's)."""
    server, expected = server
    if expected["temperature"] != 0.0:
        pytest.skip("the embedded model on vLLM does not loop greedily on this question")
    client = server.client()

    def answer(**kw):
        r = client.chat.completions.create(model="clawrl", messages=ASK, max_tokens=24, **kw)
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            return store.get_turn(r.id)

    plain = answer()
    assert len(set(plain.response_ids)) < len(plain.response_ids)  # it repeats itself
    penalised = answer(presence_penalty=2.0)
    assert len(set(penalised.response_ids)) == len(penalised.response_ids) == 24
    assert answer(presence_penalty=0.0).response_ids == plain.response_ids


def test_top_k_out_of_range_is_a_400(server):
    import openai

    server, _ = server
    with pytest.raises(openai.BadRequestError, match="top_k"):
        server.client().chat.completions.create(
            model="clawrl", messages=ASK, max_tokens=4, extra_body={"top_k": -2}
        )
