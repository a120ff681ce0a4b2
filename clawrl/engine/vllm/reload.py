"""Full fine-tuning's versions loaded into a running vLLM in place (`train.weights = "full"`).

vLLM 0.32's route for reinforcement learning's weight syncs, enabled by `VLLM_SERVER_DEV_MODE=1`
(clawrl sets it on a server it starts for full weights; behind the key, as every route but
/health and /metrics is: guard/): the worker's `reload_weights(weights_path=...)`
(`vllm/v1/worker/gpu_worker.py`, which the CPU worker inherits; `model_executor/model_loader/
reload/inplace.py`) reads a folder's safetensors through the server's own loader and copies them
into the live parameters with `model.load_weights`, then re-runs the kernel-format processing. A
swap is, on the server's own routes:

    POST /pause?mode=keep                       no decoding step runs; requests in flight are
                                                frozen, new ones queue (none is refused)
    POST /collective_rpc  reload_weights        the folder's weights copied in (every worker)
    POST /reset_prefix_cache?reset_running_requests=true
                                                the KV cached by the old weights dropped; the
                                                frozen requests are recomputed on the new ones
    POST /resume                                (always, in `finally`)

So a request in flight carries on, and its tokens after the swap come from the new weights,
computed on a KV cache the new weights made (the local engine keeps the old KV instead).

A folder vLLM fails to load (a shape that does not fit the model) may leave some parameters
written: the previously served folder is loaded again, then the folder is refused
(`VersionRefused`); an error while the server is gone goes up as it is (`EngineFailed`: tried
again at the next poll).

    ReloadUnsupported (an EngineUnavailable): the server has no weight-reload routes
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clawrl.engine.base import EngineFailed, EngineUnavailable, VersionRefused
from clawrl.version_folder import full_weight_files, is_adapter, weights_pruned

Call = Callable[..., Awaitable[Any]]  # VLLMEngine._call: (method, path, body, params=) -> its answer
DEV_MODE = "VLLM_SERVER_DEV_MODE"


class ReloadUnsupported(EngineUnavailable):
    """The vLLM server cannot reload its weights in place (started without the dev routes)."""


def check_folder(folder: Path, version: str) -> None:
    """Refuse a folder vLLM cannot reload: not full weights, or its weights pruned."""
    why = None
    if not folder.is_dir():
        why = "there is no such folder"
    elif is_adapter(folder):
        why = "it holds a LoRA adapter, and this server serves full weights (train.weights 'full')"
    elif weights_pruned(folder) or not any(p.suffix == ".safetensors" for p in full_weight_files(folder)):
        why = "it holds no model weights (*.safetensors; pruned: train.keep_versions)"
    elif not (folder / "config.json").is_file():
        why = "it holds no config.json"
    if why is not None:
        raise VersionRefused(f"cannot serve {version} from {folder}: {why}")


async def check_routes(call: Call, url: str) -> None:
    """Raise ReloadUnsupported when the server at `url` has no /pause route (no dev mode)."""
    try:
        await call("GET", "/is_paused")
    except EngineFailed as exc:  # 404: no such route
        raise ReloadUnsupported(
            f"train.weights 'full' on vLLM loads each version into the running server in place, but "
            f"the vLLM server at {url} has no weight-reload routes ({exc}): start it with {DEV_MODE}=1 "
            "in its environment (and the key guard: docs/vllm.md), or serve with --engine.kind local"
        ) from exc


async def reload(call: Call, folder: Path, previous: Path, loaded: Callable[[], None] | None = None) -> float:
    """Load `folder`'s weights into the running server between two decoding steps; return the
    seconds the server was paused. `loaded` runs once they are in, before vLLM resumes, so no token
    of the new weights is read before it (the engine announces the version there). On a failed
    load, `previous` is loaded again first."""
    start = time.monotonic()
    await call("POST", "/pause", params={"mode": "keep", "clear_cache": "false"})
    try:
        try:
            await _load(call, folder)
        except EngineFailed as exc:  # refused, or failed part way: the served weights are put back
            await _load(call, previous)  # raises on its own where the server is gone
            raise VersionRefused(f"vLLM could not load {folder}: {exc}") from exc
        await call("POST", "/reset_prefix_cache", params={"reset_running_requests": "true"})
        if loaded is not None:
            loaded()
    finally:
        await call("POST", "/resume")
    return time.monotonic() - start


async def _load(call: Call, folder: Path) -> None:
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    await call("POST", "/collective_rpc", body)
