"""Full-weight versions reloaded into vLLM in place (engine/vllm/reload.py), against a scripted
vLLM that answers its 0.32 routes as the real one does (tests/service/test_vllm.py runs the real)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from clawrl.config import VLLMConfig
from clawrl.engine.base import EngineFailed, VersionRefused
from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.reload import ReloadUnsupported, check_folder, check_routes
from clawrl.engine.vllm.server import VLLMServer, vllm_env
from clawrl.types import Version


class ScriptedVLLM:
    """vLLM's dev routes (VLLM_SERVER_DEV_MODE=1) and /v1/models; a folder named 'broken' fails to
    load part way (a 500, as an exception in the worker's reload_weights answers)."""

    def __init__(self, dev_mode: bool = True) -> None:
        self.dev_mode = dev_mode
        self.calls: list[str] = []
        self.weights = "/models/base"  # the folder whose weights the model holds
        self.paused = False
        self.engine: VLLMEngine | None = None
        self.served_at_resume: list[str] = []  # the version the engine announced when vLLM resumed

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "clawrl-base", "root": "/models/base"}]})
        if not self.dev_mode:
            return httpx.Response(404, json={"detail": "Not Found"})
        self.calls.append(path)
        if path == "/is_paused":
            return httpx.Response(200, json={"is_paused": self.paused})
        if path in ("/pause", "/resume"):
            self.paused = path == "/pause"
            if path == "/resume" and self.engine is not None:
                self.served_at_resume.append(self.engine.version)
            assert path == "/resume" or request.url.params["mode"] == "keep"  # nothing aborted
            return httpx.Response(200, json={"status": path[1:]})
        if path == "/collective_rpc":
            assert self.paused, "weights reloaded while vLLM decodes"
            folder = json.loads(request.content)["kwargs"]["weights_path"]
            self.weights = folder
            if Path(folder).name == "broken":
                return httpx.Response(500, json={"error": "size mismatch for down_proj"})
            return httpx.Response(200, json={"results": [None]})
        assert path == "/reset_prefix_cache" and request.url.params["reset_running_requests"] == "true"
        return httpx.Response(200, json={"success": True})


def _full_folder(tmp_path: Path, name: str) -> Path:
    (folder := tmp_path / name).mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


async def _engine(vllm: ScriptedVLLM) -> VLLMEngine:
    server = VLLMServer(VLLMConfig(), "http://vllm")
    engine = VLLMEngine(
        server,
        model_name="m",
        max_context=512,
        stop_token_ids=frozenset(),
        max_lora_rank=16,
        full_weights=True,
    )
    engine._http = httpx.AsyncClient(transport=httpx.MockTransport(vllm), base_url="http://vllm")
    models = (await engine._call("GET", "/v1/models"))["data"]
    engine._base, engine._base_folder = models[0]["id"], Path(models[0]["root"])
    engine._serving = (engine._base, None)
    return engine


def test_a_version_is_loaded_while_vllm_is_paused_and_announced_once_loaded(tmp_path):
    vllm = ScriptedVLLM()
    v1, broken = _full_folder(tmp_path, "v1"), _full_folder(tmp_path, "broken")

    async def run() -> None:
        engine = vllm.engine = await _engine(vllm)
        await engine.serve_version(Version("v1", 1, str(v1)))
        assert vllm.calls == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
        assert vllm.served_at_resume == ["v1"]  # announced once loaded, before any token of it
        assert engine.version == "v1" and vllm.weights == str(v1) and not vllm.paused
        with pytest.raises(EngineFailed, match="base weights"):  # gone while v1 is served
            await engine.score([1], [2], base=True)
        # A folder vLLM fails on part way: v1 is loaded again, vLLM resumes, the version is refused.
        vllm.calls.clear()
        with pytest.raises(VersionRefused, match="could not load .*broken.*size mismatch"):
            await engine.serve_version(Version("v2", 2, str(broken)))
        assert vllm.calls == ["/pause", "/collective_rpc", "/collective_rpc", "/resume"]
        assert engine.version == "v1" and vllm.weights == str(v1) and not vllm.paused
        assert vllm.served_at_resume == ["v1", "v1"]
        await engine.serve_version(Version("v0", 0, None))  # a rollback to v0: the base folder again
        assert engine.version == "v0" and vllm.weights == "/models/base"
        await engine._http.aclose()

    asyncio.run(run())


def test_a_folder_vllm_cannot_reload_is_refused_before_vllm_pauses(tmp_path):
    adapter = _full_folder(tmp_path, "adapter")
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    pruned = _full_folder(tmp_path, "pruned")
    (pruned / "model.safetensors").unlink()
    for folder, why in (
        (adapter, "LoRA adapter"),
        (pruned, "no model weights"),
        (tmp_path / "gone", "no such"),
    ):
        with pytest.raises(VersionRefused, match=why):
            check_folder(folder, "v3")


def test_a_vllm_without_the_reload_routes_is_refused_and_a_started_one_gets_them(monkeypatch):
    async def attach() -> None:
        engine = await _engine(ScriptedVLLM(dev_mode=False))
        with pytest.raises(ReloadUnsupported, match="VLLM_SERVER_DEV_MODE=1"):
            await check_routes(engine._call, "http://vllm")
        await engine._http.aclose()

    asyncio.run(attach())
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    assert vllm_env(VLLMConfig(), "k", reload_weights=True)["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in vllm_env(VLLMConfig(), "k")  # LoRA: vLLM's routes as they are
