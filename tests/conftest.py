"""Shared fixtures: a tiny random model with the real tokenizer, and live servers.

`RemoteServer` (clawrl.launcher's `ServerProcess` with the tests' defaults) starts
`python -m clawrl serve` as a real subprocess on a free 127.0.0.1 port and waits
for /healthz, as a user would run it.

Engines: `tiny_server` runs on the `engine` fixture, "local" unless a module
parametrises it with `BOTH_ENGINES`. On "local" the gateway serves the tiny
random model itself; on "vllm" it attaches to the session's ONE vLLM server
(`vllm_gateway`: a gateway started with `--engine.vllm.start true`, 25-60 s,
from the venv scripts/setup-vllm installs once) serving the embedded SmolLM2
with the tiny model's 512-token window, so the same limits hold. The vLLM tests
skip only when the package registry cannot be reached to install vLLM.

Every `python -m clawrl ...` the tests start, directly or through the package (the launcher's
servers, their trainers, a trainer group's ranks), is forked from one pre-imported process per
worker (tests/preload), and a run that leaves a process behind fails, naming it (tests/strays.py).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from clawrl.launcher import ServerProcess
from clawrl.testing import make_tiny_model
from tests import strays, tiers
from tests.preload import Preloader
from tests.timing import limit

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 512  # the tiny model's window; the session's vLLM server serves the same
CLAWRL = (sys.executable, "-m", "clawrl")  # forked from the worker's preloader (tests/preload)
PRELOADER = pytest.StashKey[Preloader]()
BOTH_ENGINES = pytest.mark.parametrize("engine", ["local", "vllm"], scope="module")


# The slowest work units first (measured with --durations), so that the workers finish together
# rather than one running the longest file alone at the end; the rest keep their order.
HEAVY_FIRST = (
    "tests/client/",
    "tests/service/test_vllm.py",
    "tests/service/test_train_group.py",
    "tests/slow/test_envs.py",
    "tests/service/test_trainer.py",
    "tests/service/test_trainer_group.py",
    "tests/service/test_guard.py",
    "tests/slow/",
    "tests/browser/",
    "tests/sandbox/",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the heavy files first (HEAVY_FIRST): xdist hands out work units in this order."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if path.startswith(prefix)), len(HEAVY_FIRST))

    items.sort(key=rank)  # stable: a file's tests keep their order


VLLM_PARAM = re.compile(r"\[(?:[^\]]*-)?vllm(?:-[^\]]*)?\]")  # an id like [vllm] or [vllm-2]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units for `pytest -n 3` (scripts/test): a test file's tests stay on one worker, so its
    module-scoped server starts once; every test on the session's vLLM server (the `engine=vllm`
    half of a BOTH_ENGINES module, and tests/service/test_vllm.py) goes to one worker, so vLLM
    starts once (25-60 s, 3 GB). (xdist's own `loadgroup` cannot do it on pytest 9.2, whose node
    ids it can no longer suffix.) Without xdist this hook is never called."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesWithVllmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if VLLM_PARAM.search(nodeid) or path == "tests/service/test_vllm.py":
                return "vllm"
            return path

    return FilesWithVllmTogether(config, log)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(strays, "clawrl-strays")
    config.pluginmanager.register(tiers, "clawrl-tiers")  # worker seconds per tier, at the end


def pytest_sessionstart(session: pytest.Session) -> None:
    """The worker's preloader starts importing while the tests are collected (tests/preload): ~55
    servers a run, each ~7 s of imports saved. Only with one OpenMP thread (scripts/test's workers):
    torch's import starts a thread pool otherwise, and a process with threads is not forked; and on
    Linux only. Not in xdist's controller, which runs no test. CLAWRL_TEST_PRELOAD=0 starts each
    process afresh."""
    config = session.config
    off = os.environ.get("CLAWRL_TEST_PRELOAD", "1") == "0" or os.environ.get("OMP_NUM_THREADS") != "1"
    if off or sys.platform != "linux" or config.pluginmanager.hasplugin("dsession"):
        return
    log = Path(tempfile.mkdtemp(prefix="clawrl-preload-log-")) / "preload.log"
    preloader = config.stash[PRELOADER] = Preloader(log)
    config.stash[strays.KEPT] = preloader.own_pids  # kept to the end: the strays it forked show


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """The children of the tests get the preloader once it has imported."""
    preloader = session.config.stash.get(PRELOADER, None)
    if preloader is not None:
        preloader.wait(limit(300))
        os.environ.update(preloader.env)
    return (yield)


def pytest_unconfigure(config: pytest.Config) -> None:
    """After the check for strays (tests/strays.py, at the session's end)."""
    preloader = config.stash.get(PRELOADER, None)
    if preloader is not None:
        preloader.stop()


class RemoteServer(ServerProcess):
    """The package's launcher (clawrl.launcher) with the tests' defaults: the trainer and the guard
    off unless `args` turn them on (a trainer would only add a torch import per server; a tiny random
    model has no general skill for the canary to guard), every time limit through `limit()`, and the
    repository root as the working folder."""

    def __init__(
        self,
        run_dir: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        super().__init__(
            run_dir,
            args,
            env=env,
            off=("train", "guard"),
            cwd=ROOT,
            start_timeout_s=limit(timeout),
            request_timeout_s=limit(120),
        )

    def own_pid(self) -> int:
        """The server's own pid, which it writes in its run folder's lock: `proc` is its stand-in
        when the preloader forked it (tests/preload)."""
        return int((self.run_dir / "server.lock").read_text())


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The python of vLLM's venv, installed once into the cache folder by scripts/setup-vllm."""
    proc = subprocess.run([str(ROOT / "scripts" / "setup-vllm")], capture_output=True, text=True)
    if proc.returncode == 75:
        pytest.skip(f"vLLM cannot be installed here: {proc.stderr.strip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/setup-vllm failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def vllm_args(model_dir: Path, *more: str) -> list[str]:
    """`clawrl serve` arguments for a gateway on vLLM serving `model_dir` in a CONTEXT-token window."""
    return ["--model", str(model_dir), "--model.max-context", str(CONTEXT), "--engine.kind", "vllm", *more]


def vllm_start(vllm_python: str) -> list[str]:
    """`clawrl serve` arguments that start a vLLM server (the judge off, as on every vLLM gateway of
    the tests), eager: vLLM's CPU build otherwise compiles
    the model with inductor at every start, work no test asserts on (the vLLM tests: 538 CPU-seconds
    eager, 625 compiled; docs/results.md, "The suite, seventh session")."""
    start = ["--engine.vllm.start", "true", "--engine.vllm.python", vllm_python, "--judge.enabled", "false"]
    return [*start, "--engine.vllm.args", '["--enforce-eager"]']


VLLM_KEY = {"CLAWRL_VLLM_API_KEY": f"sk-vllm-{secrets.token_hex(16)}"}  # the session vLLM's key


@pytest.fixture(scope="session")
def vllm_gateway(vllm_python, embedded_model_dir, tmp_path_factory) -> RemoteServer:
    """The session's ONE vLLM server, started and supervised the way a user starts it: by a gateway
    with `--engine.vllm.start true` (this gateway; other gateways attach to its vLLM with its key,
    VLLM_KEY, which this one gives it instead of drawing one)."""
    run_dir = tmp_path_factory.mktemp("vllm-owner") / "run"
    start = vllm_start(vllm_python)
    # vLLM's dev routes too (as clawrl starts it for train.weights full: engine/vllm/reload.py), so a
    # full-weight gateway can attach to this one server instead of starting another (minutes).
    env = {**VLLM_KEY, "VLLM_SERVER_DEV_MODE": "1"}
    server = RemoteServer(run_dir, vllm_args(embedded_model_dir, *start), env=env, timeout=300)
    assert server.vllm_url is not None, server.health()
    yield server
    server.stop()


def attach_gateway(run_dir: Path, vllm_gateway: RemoteServer, model_dir: Path, *args: str) -> RemoteServer:
    """A gateway attached to the session's vLLM server, with its own run folder and store."""
    url = vllm_gateway.vllm_url
    assert url is not None
    more = ["--engine.vllm.url", url, "--judge.enabled", "false", *args]
    return RemoteServer(run_dir, vllm_args(model_dir, *more), env=VLLM_KEY)


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The converted embedded SmolLM2 folder (converted once into the user cache)."""
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    return ensure_embedded(Config().cache_dir())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """SmolLM2's real tokenizer on a tiny random model: fast tests that still tokenise for real."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), embedded_model_dir)


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 with Qwen3's real tokenizer, chat template and generation config
    (clawrl/model/tiny.py; 4,096-token window). Each worker writes its own in seconds; the
    tokenizer.json they share is converted once into the user cache (atomically)."""
    from clawrl.config import Config
    from clawrl.model.tiny import build_tiny_model

    return build_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3-model"), Config().cache_dir())


@pytest.fixture(scope="module")
def engine() -> str:
    """The engine behind `tiny_server`: "local", unless a module parametrises it (BOTH_ENGINES)."""
    return "local"


@pytest.fixture(scope="module")
def tiny_server(request: pytest.FixtureRequest, engine: str, tmp_path_factory, tiny_model_dir: Path):
    """A gateway on `engine`: the tiny model served locally, or SmolLM2 on the session's vLLM."""
    run_dir = tmp_path_factory.mktemp(f"srv-{engine}") / "run"
    if engine == "vllm":
        vllm = request.getfixturevalue("vllm_gateway")
        server = attach_gateway(run_dir, vllm, request.getfixturevalue("embedded_model_dir"))
    else:
        server = RemoteServer(run_dir, ["--model", str(tiny_model_dir)])
    yield server
    server.stop()
