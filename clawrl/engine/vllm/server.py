"""The vLLM server behind the vLLM engine: started and supervised by clawrl, or attached to.

Started (`engine.vllm.start = true`): `python -m vllm.entrypoints.openai.api_server`
from vLLM's own venv (scripts/setup-vllm makes one; `engine.vllm.python` names
another), bound to 127.0.0.1, its output appended to `<run_dir>/logs/vllm.log`.
It runs in a process group of its own and gets SIGTERM if clawrl dies (so a
killed clawrl leaves no 3 GB server behind). `connect` starts it and waits for
`/health` before clawrl serves anything; a server that exits or never answers
is a `VLLMUnavailable` with the end of its log. A port clawrl chose itself that another process
took before vLLM bound it (vLLM binds ~30 s after it starts) is chosen anew, up to `PORT_TRIES`
times. While clawrl runs, `watch`
checks `/health` (and the process) every `health_poll_s`; when the server is
gone it is started again after `restart_backoff_s`, doubling up to
`restart_backoff_max_s`, and `on_ready` (the engine reloading its adapter) runs
before it counts as up again. Gone means exited, or alive but silent on `/health` for
`unresponsive_s`: a live server that misses a check is counted down at once (requests wait or
move) but killed only then, since its `/health` stalls for seconds on a loaded machine or while
weights load in place, and a restart costs a start (and, in a test, the requests of that start).

Attached (`engine.vllm.url`): the same checks, but nothing is started; a
server that stops answering is reported down until it answers again.

The key: vLLM's routes require a bearer key that only the gateway holds, so no other local user
can query the model unrecorded or load and unload its adapters. A started server gets
`engine.vllm.api_key`, or a random one drawn at start, in its environment (VLLM_API_KEY: a command
line is readable by every user, an environment only by its owner). vLLM's own key guards /v1 and
a few other prefixes only, and vLLM 0.32 answers completions at /invocations and loads adapters at
/adapters too, so the started server also runs `guard/clawrl_vllm_guard.py` (`--middleware`),
which wants the key on every path but /health and /metrics. `connect` refuses a server whose /v1
or /invocations answers without the key (`engine.vllm.require_key`), or that refuses the key.

Restarts on a GPU take the memory budget's KV bytes (`--kv-cache-memory-bytes`,
`engine.vllm.restart_kv_cache_mb`) instead of profiling: beside a running trainer, the memory free
at that moment is not the plan's. On a CPU the KV cache is explicit at every start already
(VLLM_CPU_KVCACHE_SPACE).

Full fine-tuning: a started server gets VLLM_SERVER_DEV_MODE=1, whose routes (/pause,
/collective_rpc, ...) reload its weights in place (reload.py); the guard keeps them behind the key.

    VLLMUnavailable (an EngineUnavailable): the server cannot be reached or started
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from clawrl.config import VLLMConfig
from clawrl.config.section import VLLM_KEY_ENV
from clawrl.engine.base import EngineError, EngineUnavailable

log = logging.getLogger(__name__)

PORT_TRIES = 3  # starts on a fresh port when the one chosen was taken before vLLM bound it
PORT_TAKEN = "Address already in use"  # what vLLM's log says then
BASE_NAME = "clawrl-base"  # the name the started server serves the base model under
GUARD_DIR = Path(__file__).resolve().parent / "guard"  # on the started server's PYTHONPATH
GUARD = "clawrl_vllm_guard.Guard"  # its --middleware: the key on every route (the module docstring)
GUARDED = (401, 403)  # what a route that wants a key answers without it
ABSENT = (404, 405, 501)  # a route this vLLM does not have
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class VLLMUnavailable(EngineUnavailable):
    """The vLLM server cannot be reached or started."""


@dataclass
class ServerHealth:
    status: str = "starting"  # starting | ok | down
    url: str = ""
    pid: int | None = None  # of the server clawrl started (None: attached)
    restarts: int = 0
    last_exit: int | None = None
    last_error: str | None = None


def vllm_command(
    python: str,
    model: Path,
    port: int,
    v: VLLMConfig,
    max_context: int,
    lora: bool,
    rope: dict[str, Any] | None = None,
    gpu_share: float | None = None,
    max_cpu_loras: int | None = None,
) -> list[str]:
    """The api_server command line clawrl starts (docs/vllm.md lists the same flags for attaching).
    `rope`: the config overrides of a window past the trained one (`model.load.vllm_rope`);
    `gpu_share`: the server's share of its GPU in the memory budget (None: a CPU); `max_cpu_loras`:
    the adapters vLLM keeps in host memory (its CPU cache, never fewer than --max-loras)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    cmd += ["--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-model-len", str(max_context), "--max-logprobs", "20"]
    # The logprob clawrl records is log_softmax(logits / T), the distribution sampled from.
    cmd += ["--logprobs-mode", "processed_logprobs", "--enable-prompt-tokens-details"]
    # Grammars (clawrl/chat/grammar.py) compiled by llguidance, as the trainer replays them: under
    # "auto", vLLM would give them to xgrammar, which reads their %json but not their JSON style.
    cmd += ["--structured-outputs-config", '{"backend": "guidance"}']
    if lora:
        loras = v.max_loras or 2  # set from the users at start (model/adapter_slots.py)
        cmd += ["--enable-lora", "--max-lora-rank", str(v.max_lora_rank), "--max-loras", str(loras)]
        cmd += ["--max-cpu-loras", str(max(max_cpu_loras or loras, loras))]
    if rope is not None:
        cmd += ["--hf-overrides", json.dumps(rope)]
    if gpu_share is not None:  # vLLM's share counts all its process holds, as the budget's does
        cmd += ["--gpu-memory-utilization", f"{gpu_share:.2f}"]
    cmd += ["--middleware", GUARD]  # the key on every route, not /v1 alone (the module docstring)
    return cmd + list(v.args)


def vllm_env(v: VLLMConfig, key: str | None = None, reload_weights: bool = False) -> dict[str, str]:
    """Environment of the started server: offline, runtime LoRA loading on, a bounded CPU KV cache,
    and the key its routes require (the module docstring); with `reload_weights` (full fine-tuning),
    vLLM's dev routes, through which each version is loaded in place (reload.py)."""
    return {
        **os.environ,
        **({"VLLM_API_KEY": key} if key else {}),
        **({"VLLM_SERVER_DEV_MODE": "1"} if reload_weights else {}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(GUARD_DIR), os.environ.get("PYTHONPATH")) if p),
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": f"{v.kv_cache_gib:g}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
    }


def restart_args(v: VLLMConfig, command: list[str]) -> list[str]:
    """What a restart adds to the command line: the budget's KV bytes on a GPU (the module docstring)."""
    flags = {arg.split("=")[0] for arg in command}
    if v.restart_kv_cache_mb is None or "--gpu-memory-utilization" not in flags:
        return []
    if "--kv-cache-memory-bytes" in flags:  # engine.vllm.args sized it at every start
        return []
    return ["--kv-cache-memory-bytes", str(v.restart_kv_cache_mb << 20)]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
        os.killpg(pgid, sig)


def _die_with_parent() -> None:  # runs in the child between fork and exec: one syscall, no locks
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


Relaunch = Callable[[], tuple[str, list[str]]]  # a fresh port's url and command line


class VLLMServer:
    def __init__(
        self,
        v: VLLMConfig,
        url: str,
        command: list[str] | None = None,
        log_path: Path | None = None,
        relaunch: Relaunch | None = None,
        devices: str | None = None,
        reload_weights: bool = False,
    ) -> None:
        self.config = v
        self.reload_weights = reload_weights  # a started server gets vLLM's dev routes (vllm_env)
        self.devices = devices  # CUDA_VISIBLE_DEVICES of a started server: the placement plan's GPU
        self.url = url.rstrip("/")
        self._command = command  # None: attached, nothing to start
        self._log_path = log_path
        self._log_start = 0  # where the log of the latest start begins
        self._relaunch = relaunch  # None: the port is the user's, never chosen anew
        self._proc: subprocess.Popen[bytes] | None = None
        self.health = ServerHealth(url=self.url)
        self.on_ready: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        given = v.api_key.get_secret_value() if v.api_key is not None else None
        # vLLM's key: given, or drawn for a server clawrl starts (None: attached without one).
        self.key = given or (secrets.token_urlsafe(32) if command is not None else None)

    def auth(self) -> dict[str, str]:
        """The headers of a request to vLLM: its key."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    @property
    def up(self) -> bool:
        return self.health.status == "ok"

    def suspect(self, why: str) -> None:
        """A request found the server failing: count it down until `/health` answers again (then the
        engine's `on_ready` runs, as after a restart). A replica set moves its requests meanwhile."""
        if self.health.status == "ok":
            self.health.status, self.health.last_error = "down", why
            log.error("the vLLM server at %s failed a request: %s", self.url, why)

    def launch(self) -> None:
        """Start the server's process now, in this thread, for `connect(launched=True)` to wait on
        from another: the child's death signal (`_die_with_parent`) fires when the *thread* that
        started it ends, so a server started from a worker thread is stopped with that thread."""
        if self._command is not None:
            self._spawn()

    def connect(self, *, launched: bool = False) -> None:
        """Start the server (if clawrl owns it and `launch` did not) and wait until it answers;
        raise VLLMUnavailable."""
        for tries_left in range(PORT_TRIES - 1, -1, -1):
            try:
                return self._connect(spawn=not launched)
            except VLLMUnavailable:
                if not tries_left or not self._port_taken():
                    raise
                self._new_port()
                launched = False

    def _connect(self, spawn: bool = True) -> None:
        if self._command is not None and spawn:
            self._spawn()
        deadline = time.monotonic() + (self.config.startup_timeout_s if self._command else 5.0)
        while not self._answers_sync():
            self._check_alive()
            if time.monotonic() > deadline:
                self.close()
                raise VLLMUnavailable(f"no vLLM server answers at {self.url}/health{self._log_tail()}")
            time.sleep(0.5)
        try:
            self._check_key()
        except VLLMUnavailable:
            self.close()
            raise
        self.health.status = "ok"

    def _check_key(self) -> None:
        """Refuse a server whose routes answer without the key, or that refuses it (the module docstring)."""
        bare = self._status("GET", "/v1/models", {})
        if self.key is None and bare in GUARDED:
            raise VLLMUnavailable(
                f"the vLLM server at {self.url} requires a key: give it as engine.vllm.api_key or "
                f"${VLLM_KEY_ENV}"
            )
        if self.key is not None and (status := self._status("GET", "/v1/models", self.auth())) != 200:
            raise VLLMUnavailable(
                f"the vLLM server at {self.url} answers {status} to /v1/models with engine.vllm.api_key: "
                "it was started with another key"
            )
        if not self.config.require_key:
            return
        if bare not in GUARDED:
            raise VLLMUnavailable(self._open("/v1/models", bare))
        if (other := self._status("POST", "/invocations", {})) not in GUARDED + ABSENT:
            raise VLLMUnavailable(self._open("/invocations", other))

    def _open(self, path: str, status: int) -> str:
        whose = "clawrl started" if self._command else "attached"
        return (
            f"the vLLM server at {self.url} ({whose}) answers {path} without a key ({status}): anyone on "
            "this machine could query the model unrecorded, or load and unload its adapters. Start it "
            f"with VLLM_API_KEY=<a secret> in its environment, PYTHONPATH={GUARD_DIR} and --middleware "
            f"{GUARD} (vLLM's own key guards /v1 only), and give clawrl the same key as "
            f"engine.vllm.api_key or ${VLLM_KEY_ENV}; or set engine.vllm.require_key false where no one "
            "else can reach its port"
        )

    def _status(self, method: str, path: str, headers: dict[str, str]) -> int:
        try:
            return httpx.request(method, self.url + path, headers=headers, json={}, timeout=10).status_code
        except httpx.HTTPError as exc:
            raise VLLMUnavailable(f"the vLLM server at {self.url} failed: {exc}") from exc

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="clawrl-vllm-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self.close)

    def close(self, grace_s: float = 30.0) -> int | None:
        """Stop the started server and its engine processes (its whole process group): SIGTERM, and
        SIGKILL after `grace_s`; return how its main process ended (None: nothing was started)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # what is left of the group: vLLM's engine processes
        return proc.returncode

    def _port_taken(self) -> bool:
        """Whether the latest start failed for its port (another process bound it first)."""
        if self._relaunch is None or self._log_path is None or not self._log_path.is_file():
            return False
        with open(self._log_path, "rb") as f:
            f.seek(self._log_start)
            return PORT_TAKEN.encode() in f.read()

    def _new_port(self) -> None:
        assert self._relaunch is not None
        old = self.url
        url, self._command = self._relaunch()
        self.url = self.health.url = url.rstrip("/")
        log.warning("the port of %s was taken before vLLM bound it; starting it at %s", old, self.url)

    def _spawn(self, more: list[str] | None = None) -> None:
        assert self._command is not None and self._log_path is not None
        self._log_start = self._log_path.stat().st_size if self._log_path.is_file() else 0
        env = vllm_env(self.config, self.key, self.reload_weights)
        if self.devices is not None:  # the placement plan's GPU: vLLM's device 0
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        with open(self._log_path, "ab") as out:  # the child keeps its own handle
            self._proc = subprocess.Popen(
                self._command + (more or []),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (one syscall, see _die_with_parent)
            )
        self.health.pid = self._proc.pid
        log.info("started vLLM (pid %d) at %s; its log: %s", self._proc.pid, self.url, self._log_path)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            self._proc = None
            raise VLLMUnavailable(f"the vLLM server exited with {code} before answering{self._log_tail()}")

    def _answers_sync(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    async def _answers(self, http: httpx.AsyncClient) -> bool:
        try:
            return (await http.get(self.url + "/health", timeout=5)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _watch(self) -> None:
        async with httpx.AsyncClient() as http:
            silent_since: float | None = None  # when a live server first missed /health
            while True:
                await asyncio.sleep(self.config.health_poll_s)
                exited = self._proc is not None and self._proc.poll() is not None
                if not exited and await self._answers(http):
                    silent_since = None
                    if self.health.status != "ok":
                        await self._ready()
                    continue
                exited = self._proc is not None and self._proc.poll() is not None  # died during the check?
                self._down(exited)
                if self._command is None:
                    continue
                now = time.monotonic()
                silent_since = now if silent_since is None else silent_since
                if exited or now - silent_since >= self.config.unresponsive_s:
                    if not exited:  # hung: killed, not asked to stop
                        log.error(
                            "vLLM has not answered /health for %.0f s: restarting it", now - silent_since
                        )
                        self.health.last_exit = await asyncio.to_thread(self.close, 0.0)
                    silent_since = None
                    await self._restart(http)

    def _down(self, exited: bool) -> None:
        if exited:
            assert self._proc is not None
            self.health.last_exit = self._proc.returncode
        if self.health.status != "down":
            why = f"exited with {self.health.last_exit}" if exited else "stopped answering"
            self.health.last_error = f"the vLLM server {why}"
            log.error("%s at %s", self.health.last_error, self.url)
        self.health.status = "down"

    async def _restart(self, http: httpx.AsyncClient) -> None:
        """Start the server again after a backoff, until it answers (the delay doubles each try)."""
        delay = self.config.restart_backoff_s
        while True:
            code = await asyncio.to_thread(self.close)
            if code is not None:  # how the server that went away ended (it may have died after the check)
                self.health.last_exit = code
            log.info("restarting vLLM in %.0f s", delay)
            await asyncio.sleep(delay)
            if self._port_taken():
                self._new_port()
            self.health.restarts += 1
            self._spawn(restart_args(self.config, self._command or []))
            deadline = time.monotonic() + self.config.startup_timeout_s
            while self._proc is not None and self._proc.poll() is None and time.monotonic() < deadline:
                if await self._answers(http):
                    await self._ready()
                    return
                await asyncio.sleep(0.5)
            delay = min(delay * 2, self.config.restart_backoff_max_s)

    async def _ready(self) -> None:
        if self.on_ready is not None:
            try:
                await self.on_ready()
            except EngineError as exc:  # e.g. the served adapter could not be reloaded: serve the base
                log.error("after the vLLM restart: %s", exc)
        self.health.status = "ok"
        log.info("vLLM at %s is up (restarts: %d)", self.url, self.health.restarts)

    def _log_tail(self, lines: int = 15) -> str:
        if self._log_path is None or not self._log_path.is_file():
            return ""
        tail = self._log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; the end of {self._log_path}:\n" + "\n".join(tail)

    def report(self) -> dict[str, object]:
        return asdict(self.health)
