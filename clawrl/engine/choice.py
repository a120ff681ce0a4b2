"""Which engine serves when `engine.kind` is "auto" (the default), decided once at start.

| device | vLLM installed          | train.weights | engine                                     |
| ------ | ----------------------- | ------------- | ------------------------------------------ |
| CPU    | any                     | any           | local (vLLM's CPU build: only when asked)  |
| GPU    | yes (scripts/setup-vllm)| lora          | vLLM, started by clawrl                    |
| GPU    | yes                     | full          | vLLM, started by clawrl (each version      |
|        |                         |               | reloaded in place: engine/vllm/reload.py)  |
| GPU    | no                      | any           | local, said once with how to get vLLM      |

`engine.vllm.start`, `engine.vllm.url` or `urls` set under "auto" asks for vLLM. "vLLM installed" is the
venv `scripts/setup-vllm` makes in the cache folder (its CUDA build on a GPU machine:
`vllm-cuda-<version>`, its CPU build elsewhere: `vllm-cpu-<version>`), or `engine.vllm.python`.
An explicit kind is kept as it is: `engine.kind = "vllm"` without vLLM is refused when its
builder cannot find a python (`clawrl/engine/vllm/build.py`, naming scripts/setup-vllm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clawrl.config import Config

VLLM_VERSION = "0.32.0"  # the version scripts/setup-vllm installs, CPU or CUDA build
NO_VLLM = (
    "serving on a GPU with clawrl's local engine: no vLLM at {python}. Run scripts/setup-vllm once (it "
    "installs vLLM {version}'s CUDA build in a venv of its own, a few GB) and start clawrl again to serve "
    "through vLLM. Without it, the local engine decodes a padded batch with eager PyTorch (no paged KV "
    "cache, CUDA graphs or fused kernels): fewer concurrent sessions in the same memory and a lower "
    "throughput under load. --engine.kind local says this choice and silences this line."
)


def venv_name(cuda: bool) -> str:
    """The folder scripts/setup-vllm makes in the cache folder for this kind of machine."""
    return f"vllm-{'cuda' if cuda else 'cpu'}-{VLLM_VERSION}"


def vllm_python_path(config: Config, cuda: bool) -> Path:
    """engine.vllm.python, else the python of the venv scripts/setup-vllm makes for this machine."""
    configured = config.engine.vllm.python
    if configured:
        return Path(configured).expanduser()
    return config.cache_dir() / venv_name(cuda) / "bin" / "python"


@dataclass(frozen=True)
class Choice:
    kind: str  # "local" | "vllm"
    start_vllm: bool = False  # "auto" chose vLLM: clawrl starts it
    note: str | None = None  # said once, at start


def choose(config: Config, cuda: bool, vllm_found: bool) -> Choice:
    """The engine for `engine.kind` on this machine (the module docstring's table)."""
    e = config.engine
    if e.kind != "auto":
        return Choice(e.kind)
    if e.vllm.start or e.vllm.url or e.vllm.urls:
        return Choice("vllm")
    if not cuda:
        return Choice("local")
    if vllm_found:
        return Choice("vllm", start_vllm=True)
    python = vllm_python_path(config, cuda)
    return Choice("local", note=NO_VLLM.format(python=python, version=VLLM_VERSION))


def resolved(config: Config, choice: Choice, cuda: bool) -> Config:
    """`config` with engine.kind the chosen one (and vLLM's python and start when "auto" chose it),
    validated again, so the vLLM rules (LoRA rank) hold for a chosen vLLM as for an asked one."""
    data = config.model_dump()
    data["engine"]["kind"] = choice.kind
    if choice.kind == "vllm" and not data["engine"]["vllm"]["python"]:
        data["engine"]["vllm"]["python"] = str(vllm_python_path(config, cuda))
    if choice.start_vllm:
        data["engine"]["vllm"]["start"] = True
    return Config.model_validate(data)
