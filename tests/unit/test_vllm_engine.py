"""The vLLM engine's pure parts: request bodies and streamed chunks to TokenEvents (no server)."""

from __future__ import annotations

import pytest

from clawrl.config import VLLMConfig, load_config
from clawrl.engine.base import EngineFailed, SamplingParams
from clawrl.engine.vllm.build import vllm_python
from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.server import VLLMServer, VLLMUnavailable, vllm_command


def _engine() -> VLLMEngine:
    server = VLLMServer(VLLMConfig(), "http://127.0.0.1:1")
    return VLLMEngine(
        server, model_name="m", max_context=512, stop_token_ids=frozenset({2}), max_lora_rank=16
    )


def test_the_body_sends_token_ids_and_asks_for_them_back():
    params = SamplingParams(
        max_tokens=5, temperature=0.7, seed=3, top_logprobs=2, stop_token_ids=frozenset({2})
    )
    body = _engine()._body("clawrl-base", [1, 2, 3], params)
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["stop_token_ids"] == [2] and body["seed"] == 3 and body["logprobs"] == 2
    # ignore_eos ignores every stop token, as on the local engine; top_p 0 is greedy.
    eos = _engine()._body(
        "m", [1], SamplingParams(max_tokens=5, ignore_eos=True, stop_token_ids=frozenset({2}))
    )
    assert eos["stop_token_ids"] == [] and eos["ignore_eos"]
    greedy = _engine()._body("m", [1], SamplingParams(max_tokens=5, temperature=0.9, top_p=0.0))
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0


def test_each_user_has_a_cache_salt_of_their_own_and_a_new_one_once_forgotten():
    """vLLM reuses a prompt's cached blocks only for the same salt: a user never another's."""
    import asyncio

    engine, other = _engine(), _engine()

    def salt(e: VLLMEngine, user: str) -> str:
        return e._body("m", [1], SamplingParams(max_tokens=1, adapter=user))["cache_salt"]

    alice, bob = salt(engine, "alice"), salt(engine, "bob")
    assert alice != bob and alice == salt(engine, "alice")
    assert len(alice) == 64 and not set(alice) & set("/@\\")  # what vLLM accepts
    assert salt(other, "alice") != alice  # drawn from a key of each engine's: nobody can guess it
    asyncio.run(engine.forget_user("alice"))
    assert salt(engine, "alice") not in (alice, bob) and salt(engine, "bob") == bob


def test_a_chunk_with_several_tokens_becomes_several_events():
    chunk = {
        "choices": [
            {
                "token_ids": [7, 2],
                "logprobs": {
                    "token_logprobs": [-0.5, -0.1],
                    "top_logprobs": [{"token_id:7": -0.5, "token_id:9": -1.5}, {"token_id:2": -0.1}],
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens_details": {"cached_tokens": 16}},
    }
    first, last = _engine()._events(chunk, "v1", first=True)
    assert (first.token_id, first.logprob, first.version, first.cached_tokens) == (7, -0.5, "v1", 16)
    assert first.top_logprobs == ((7, -0.5), (9, -1.5)) and first.finish_reason is None
    assert (last.token_id, last.finish_reason, last.cached_tokens) == (2, "stop", 0)


def test_a_chunk_whose_ids_and_logprobs_disagree_fails_the_request():
    chunk = {"choices": [{"token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5]}}]}
    with pytest.raises(EngineFailed, match="2 token ids but 1 logprobs"):
        _engine()._events(chunk, "v0", first=False)


def test_the_started_server_records_what_the_sampler_used():
    cmd = vllm_command("py", "/m", 8001, VLLMConfig(max_lora_rank=8), 512, lora=True)  # type: ignore[arg-type]
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert cmd[cmd.index("--max-lora-rank") + 1] == "8" and cmd[cmd.index("--max-model-len") + 1] == "512"
    assert "--enable-lora" not in vllm_command("py", "/m", 1, VLLMConfig(), 512, lora=False)  # type: ignore[arg-type]


def test_a_missing_vllm_venv_says_how_to_make_one(tmp_path):
    config = load_config(None, {"engine": {"kind": "vllm", "vllm": {"start": True, "python": str(tmp_path)}}})
    with pytest.raises(VLLMUnavailable, match="no vLLM python at .*run scripts/setup-vllm"):
        vllm_python(config)


def test_vllm_serves_past_the_trained_window_only_with_the_trainers_rope(tiny_model_dir):
    """`scale_rope = "always"`: vLLM gets the same YaRN the trainer scores with (attention factor
    included); the default per-sequence mode cannot be had on vLLM, which then serves the own window."""
    import json

    from clawrl.model.load import load_tokenizer, vllm_rope

    rope = vllm_rope(tiny_model_dir, 2048, "yarn", "always")  # the tiny model was trained on 512
    assert rope is not None and rope["max_position_embeddings"] == 2048
    assert {
        k: rope["rope_parameters"][k] for k in ("rope_type", "factor", "original_max_position_embeddings")
    } == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    }
    assert rope["rope_parameters"]["attention_factor"] == 1.0  # as scaled_config gives the trainer
    assert vllm_rope(tiny_model_dir, 2048, "yarn", "past_window") is None
    assert vllm_rope(tiny_model_dir, 512, "yarn", "always") is None
    cmd = vllm_command("py", "/m", 1, VLLMConfig(), 2048, lora=False, rope=rope)  # type: ignore[arg-type]
    assert json.loads(cmd[cmd.index("--hf-overrides") + 1]) == rope
    assert load_tokenizer(tiny_model_dir, 2048).max_context == 512
    assert load_tokenizer(tiny_model_dir, 2048, scaled=True).max_context == 2048


def test_a_turn_records_what_its_sampler_did_and_what_its_logprobs_are_of():
    from clawrl.engine.base import SamplingParams, sampling_record

    nucleus = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9)
    assert sampling_record(nucleus, processed_logprobs=True)["logprobs"] == "processed"  # vLLM
    assert sampling_record(nucleus, processed_logprobs=False)["logprobs"] == "tempered"  # the model's own
    full = SamplingParams(max_tokens=8, temperature=0.7)
    assert sampling_record(full, processed_logprobs=True) == {
        "top_p": 1.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "logprobs": "tempered",
    }
    greedy = SamplingParams(max_tokens=8, temperature=0.0, top_p=0.9, top_k=5)  # greedy ignores both
    assert sampling_record(greedy, processed_logprobs=True)["logprobs"] == "tempered"
    penalised = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=1.0)  # not penalties
    assert sampling_record(penalised, processed_logprobs=True)["logprobs"] == "processed"


# Binds its port as vLLM's api_server does (a taken one fails with "Address already in use" in the
# log), then answers /health: the supervisor's side of the start, without vLLM's 30 s.
_BINDS = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_port_taken_before_vllm_binds_it_is_chosen_anew(tmp_path):
    """clawrl chooses vLLM's port, and vLLM binds it ~30 s later: a port another process took
    meanwhile (seen in CI: "Address already in use") starts the server on a fresh one; a port the
    user gave is never changed, and its start fails saying why."""
    import socket
    import sys

    from clawrl.net import free_port

    def launch(port: int) -> tuple[str, list[str]]:
        return f"http://127.0.0.1:{port}", [sys.executable, "-c", _BINDS, str(port)]

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "vllm.log"
        fixed = VLLMServer(VLLMConfig(), *launch(port), log)
        with pytest.raises(VLLMUnavailable, match="Address already in use"):
            fixed.connect()
        chosen = VLLMServer(VLLMConfig(), *launch(port), log, relaunch=lambda: launch(free_port()))
        try:
            chosen.connect()
            assert chosen.up and chosen.url != f"http://127.0.0.1:{port}"
            assert chosen.report()["url"] == chosen.url
        finally:
            chosen.close()
