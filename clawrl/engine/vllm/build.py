"""Building the vLLM engine from the config: find vLLM's python, start or reach the server.

`build_vllm_engine` returns only once a vLLM server answers: one clawrl started
(`engine.vllm.start`) or the one at `engine.vllm.url`. It raises
`VLLMUnavailable` otherwise, and `clawrl serve` exits with status 2 and the
reason (the end of vLLM's log when it was started here).

The gateway loads the model folder's tokenizer only (the weights live in vLLM).
The window is the model's own (the embedded model: 8,192 tokens) unless
`model.scale_rope = "always"` and `model.max_context` passes it: then clawrl starts vLLM
with the trainer's scaled RoPE (`--hf-overrides`, `model.load.vllm_rope`: the same
YaRN parameters, attention factor included) at `max_context`, and every turn is recorded
RoPE-scaled, so the trainer scores it as vLLM served it. vLLM has one rotary table, so the
local engine's default (scaled only past the window, per sequence) cannot be had on it.
Attached to a running vLLM, clawrl logs the flag that server must have been started with.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.config import Config
from clawrl.engine.choice import vllm_python_path
from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.server import VLLMServer, VLLMUnavailable, vllm_command
from clawrl.model.adapter_slots import vllm_max_cpu_loras, vllm_max_loras
from clawrl.model.load import (
    LoadedTokenizer,
    generation_defaults,
    load_tokenizer,
    model_folder,
    served_context,
    vllm_rope,
)
from clawrl.model.placement import visible_devices
from clawrl.net import free_port

log = logging.getLogger(__name__)


def vllm_python(config: Config) -> str:
    """engine.vllm.python (set at start to the CUDA build's venv on a GPU, `engine/choice.py`), else
    the venv scripts/setup-vllm creates in the cache folder for its CPU build."""
    python = vllm_python_path(config, cuda=False)
    if not python.is_file():
        raise VLLMUnavailable(
            f"engine.kind 'vllm', but there is no vLLM python at {python}: run scripts/setup-vllm (it "
            "installs vLLM's CUDA build where nvidia-smi finds a GPU, its CPU build elsewhere), or set "
            "engine.vllm.python to the python of a venv vLLM is installed in"
        )
    return str(python)


def server_gpus(config: Config) -> str | None:
    """CUDA_VISIBLE_DEVICES of the vLLM clawrl starts: the placement plan's GPU for the server
    (model.device) alone, so vLLM's device 0 is that GPU; None on a CPU (no plan: no share)."""
    if config.engine.gpu_share is None:
        return None
    name, _, index = config.model.device.partition(":")
    gpu = int(index or 0) if name == "cuda" else 0  # "auto" on a GPU is GPU 0
    return visible_devices((gpu,), os.environ.get("CUDA_VISIBLE_DEVICES"))


@dataclass(frozen=True)
class ServedModel:
    """What every vLLM server of a gateway serves: the folder, its tokenizer and window, the RoPE."""

    folder: Path
    loaded: LoadedTokenizer  # the tokenizer, window and stop tokens
    rope: dict[str, Any] | None  # --hf-overrides past the trained window (model.load.vllm_rope)


def served_model(config: Config) -> ServedModel:
    m = config.model
    folder = model_folder(m.path, config.cache_dir())
    context = served_context(m.path, m.max_context)
    rope = vllm_rope(folder, context, m.rope_scaling, m.scale_rope)
    loaded = load_tokenizer(folder, context, scaled=rope is not None)
    if rope is not None:
        log.info("vLLM serves %d tokens with RoPE scaled at every position: --hf-overrides '%s'",
                 loaded.max_context, json.dumps(rope))  # fmt: skip
    return ServedModel(folder, loaded, rope)


def started_server(config: Config, served: ServedModel, *, port: int, log_path: Path) -> VLLMServer:
    """A vLLM server clawrl starts on `port` (0: a free one, found anew if taken before vLLM binds it)."""
    v = config.engine.vllm
    lora = config.train.weights == "lora"
    share = config.engine.gpu_share  # set at start on a GPU (the memory budget); None on a CPU
    v = v.model_copy(update={"max_loras": vllm_max_loras(config)})
    python = vllm_python(config)

    def launch(port: int) -> tuple[str, list[str]]:
        command = vllm_command(
            python=python,
            model=served.folder,
            port=port,
            v=v,
            max_context=served.loaded.max_context,
            lora=lora,
            rope=served.rope,
            gpu_share=share,
            max_cpu_loras=vllm_max_cpu_loras(config),
        )
        return f"http://127.0.0.1:{port}", command

    url, command = launch(port or free_port())
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A port clawrl chose may be taken before vLLM binds it: then it starts on another one.
    relaunch = None if port else lambda: launch(free_port())
    log.info("starting vLLM on %s (up to %.0f s): %s", served.folder, v.startup_timeout_s, " ".join(command))
    return VLLMServer(
        v=v,
        url=url,
        command=command,
        log_path=log_path,
        relaunch=relaunch,
        devices=server_gpus(config),
        reload_weights=not lora,  # full weights: loaded in place through vLLM's dev routes
    )


def vllm_engine(config: Config, server: VLLMServer, served: ServedModel) -> VLLMEngine:
    """The engine in front of `server`, which answers already (`VLLMServer.connect`)."""
    return VLLMEngine(
        server,
        model_name=config.server.served_model_name,
        max_context=served.loaded.max_context,
        stop_token_ids=served.loaded.stop_token_ids,
        max_lora_rank=config.engine.vllm.max_lora_rank,
        sampling_defaults=generation_defaults(served.folder, config.model.repetition_guard),
        constrained_decoding=config.engine.constrained_decoding,
        rope_scaled=served.rope is not None,
        per_user=config.per_user_adapters,
        full_weights=config.train.weights == "full",
    )


def build_vllm_engine(config: Config) -> tuple[VLLMEngine, Any]:
    v = config.engine.vllm
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per token stream and health poll
    served = served_model(config)
    if v.start:
        server = started_server(config, served, port=v.port, log_path=config.run_dir / "logs" / "vllm.log")
    else:
        assert v.url is not None  # checked by the config
        if config.engine.gpu_share is not None:
            log.info("attached: start that vLLM with --gpu-memory-utilization %.2f, the server's share of "
                     "the memory budget", config.engine.gpu_share)  # fmt: skip
        server = VLLMServer(v, v.url)
    server.connect()
    return vllm_engine(config, server, served), served.loaded.tokenizer
