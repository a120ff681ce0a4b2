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
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):  # vLLM's /health, and its /v1 behind VLLM_API_KEY if set
    def do_GET(self):
        key = os.environ.get("VLLM_API_KEY")
        shut = self.path.startswith("/v1") and key and self.headers.get("Authorization") != "Bearer " + key
        self.send_response(401 if shut else 200); self.end_headers()
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


def test_vllms_port_wants_a_key_only_the_gateway_holds(tmp_path):
    """A started server gets a key drawn at start in its environment (never on its command line,
    which every local user can read); an attached port that answers /v1 without a key is refused."""
    import subprocess
    import sys

    from clawrl.engine.vllm.server import vllm_env
    from clawrl.net import free_port

    port = free_port()
    command = [sys.executable, "-c", _BINDS, str(port)]
    started = VLLMServer(VLLMConfig(), f"http://127.0.0.1:{port}", command, tmp_path / "vllm.log")
    assert started.key and started.key != VLLMServer(VLLMConfig(), "http://x", command).key
    assert vllm_env(VLLMConfig(), started.key)["VLLM_API_KEY"] == started.key
    assert not any(started.key in arg for arg in command)
    try:
        started.connect()  # the server wants the key (the fake, as vLLM, reads VLLM_API_KEY)
        assert started.up and started.auth() == {"Authorization": f"Bearer {started.key}"}
        url = started.url
        attached = VLLMServer(VLLMConfig(url=url), url)
        with pytest.raises(VLLMUnavailable, match="requires a key: give it as engine.vllm.api_key"):
            attached.connect()
        wrong = VLLMServer(VLLMConfig(url=url, api_key="sk-wrong"), url)
        with pytest.raises(VLLMUnavailable, match="answers 401 .* another key"):
            wrong.connect()
        right = VLLMServer(VLLMConfig(url=url, api_key=started.key), url)
        right.connect()
        assert right.up
    finally:
        started.close()
    port = free_port()
    with subprocess.Popen([sys.executable, "-c", _BINDS, str(port)], env=vllm_env(VLLMConfig())) as bare:
        try:
            url = f"http://127.0.0.1:{port}"
            with pytest.raises(VLLMUnavailable, match=r"answers /v1/models without a key \(200\): anyone"):
                VLLMServer(VLLMConfig(url=url, api_key="sk-some-key"), url).connect()
            opened = VLLMServer(VLLMConfig(url=url, require_key=False), url)
            opened.connect()  # the user says no one else can reach its port
            assert opened.up
        finally:
            bare.kill()


def test_a_restart_on_a_gpu_takes_the_budgets_kv_bytes_not_what_is_free(tiny_model_dir):
    """Beside a running trainer, the memory free when vLLM restarts is not the plan's: a restart is
    given the budget's KV bytes (--kv-cache-memory-bytes) instead of profiling; a CPU's KV cache is
    explicit at every start (VLLM_CPU_KVCACHE_SPACE), and a size in engine.vllm.args stands."""
    from clawrl.engine.vllm.server import restart_args
    from clawrl.model.budget import GIB
    from clawrl.wiring.layout import plan_budget, with_budget

    vllm = {"kind": "vllm", "vllm": {"start": True}}
    config = load_config(None, {"model": {"path": str(tiny_model_dir)}, "engine": vllm})
    b = plan_budget(config, tiny_model_dir, 0, (80 * GIB,))
    v = with_budget(config, b).engine.vllm
    assert v.restart_kv_cache_mb == b.kv_bytes >> 20 > 0
    gpu = vllm_command("py", "/m", 1, v, 512, lora=True, gpu_share=b.server_share)  # type: ignore[arg-type]
    assert restart_args(v, gpu) == ["--kv-cache-memory-bytes", str(v.restart_kv_cache_mb << 20)]
    assert restart_args(v, vllm_command("py", "/m", 1, v, 512, lora=True)) == []  # type: ignore[arg-type]
    sized = v.model_copy(update={"args": ["--kv-cache-memory-bytes=1073741824"]})
    assert restart_args(sized, vllm_command("py", "/m", 1, sized, 512, lora=True, gpu_share=0.5)) == []  # type: ignore[arg-type]


def test_the_started_vllm_wants_its_key_on_every_route_but_health_and_metrics(monkeypatch):
    """vLLM's own key guards /v1 only; its /invocations answers completions and /adapters loads
    LoRA adapters: the guard clawrl loads into vLLM (`--middleware`) wants the key there too."""
    import asyncio
    import importlib.util
    import os

    from clawrl.engine.vllm.server import GUARD, GUARD_DIR, vllm_env

    cmd = vllm_command("py", "/m", 1, VLLMConfig(), 512, lora=True)  # type: ignore[arg-type]
    assert cmd[cmd.index("--middleware") + 1] == GUARD
    assert vllm_env(VLLMConfig(), "k")["PYTHONPATH"].split(os.pathsep)[0] == str(GUARD_DIR)
    spec = importlib.util.spec_from_file_location("clawrl_vllm_guard", GUARD_DIR / "clawrl_vllm_guard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    def status(path: str, key: str | None) -> int | None:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        scope = {"type": "http", "path": path, "root_path": "", "headers": headers}
        asyncio.run(module.Guard(app)(scope, None, send))
        return sent[0]["status"] if sent else None  # None: it reached vLLM's app

    monkeypatch.setenv("VLLM_API_KEY", "sk-the-key")  # the variable vLLM's process reads it from
    for path in ("/invocations", "/adapters", "/v1/completions", "/tokenize"):
        assert status(path, None) == status(path, "sk-other") == 401
        assert status(path, "sk-the-key") is None
    assert status("/health", None) is None and status("/metrics", None) is None
    assert reached.count("/invocations") == 1 and "/health" in reached


def test_an_adapter_vllm_holds_already_is_served_not_passed_over(tmp_path):
    """A gateway restarted beside an attached vLLM finds the newest version's adapter loaded there
    (vLLM answers 400 "has already been loaded"): served as it is. A 400 for anything else, with
    the adapter not loaded, still refuses the version."""
    import asyncio
    import json

    import httpx

    from clawrl.engine.base import VersionRefused
    from clawrl.types import Version

    loaded = {"base"}

    def vllm(request: httpx.Request) -> httpx.Response:  # vLLM 0.32's answers to these two routes
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": name} for name in sorted(loaded)]})
        name, path = json.loads(request.content)["lora_name"], json.loads(request.content)["lora_path"]
        if name in loaded:
            return httpx.Response(
                400, json={"message": f"The lora adapter '{name}' has already been loaded."}
            )
        if "broken" in path:
            return httpx.Response(400, json={"message": "No adapter found"})
        loaded.add(name)
        return httpx.Response(200, text="Success")

    folders = {}
    for name in ("v2", "broken"):
        (folder := tmp_path / name).mkdir()
        (folder / "adapter_config.json").write_text('{"r": 8}')
        folders[name] = str(folder)

    async def serve() -> list[str]:
        engine = _engine()
        engine._http = httpx.AsyncClient(transport=httpx.MockTransport(vllm), base_url="http://vllm")
        first = await engine._load(Version("v2", 2, folders["v2"]))
        again = await engine._load(Version("v2", 2, folders["v2"]))  # a new gateway, the same vLLM
        with pytest.raises(VersionRefused, match="vLLM refused it: 400"):
            await engine._load(Version("v3", 3, folders["broken"]))
        await engine._http.aclose()
        return [first, again]

    first, again = asyncio.run(serve())
    assert first == again and first.startswith("clawrl-v2-") and first in loaded
