"""Loading what `clawrl envs` runs: the environment class, the reward function, the tasks.

    --env calculator | bfcl                 a shipped environment (`clawrl/envs/shipped`: SHIPPED)
    --env harbor:PATH | harbor:terminal     a folder of Harbor task folders, or a shipped set of
                                            them (envs/shipped/harbor_sets; envs/harbor runs
                                            them: a bash tool in a sandbox)
    --env harbor-solutions:PATH             the same tasks, each reference solution the only command
                                            the bash tool allows (with --tool-choice bash)
    --env path/to/my_env.py:MyEnv           a class in a Python file (its folder goes on sys.path
                                            first, as when the file is run as a script)
    --env my_package.envs:MyEnv             a class in an importable module
    --reward path/to/rewards.py:func        a TRL reward function (or module:func)
    --tasks tasks.jsonl                     one task per line: {"prompt": [...] or "...", other columns}

Every failure is an `EnvLoadError` / `TaskError` naming the file, class or line, so the
command exits 2 with one clear line. `probe` builds one instance at start (the class is
called with no arguments, as TRL's `environment_factory` is), so an environment whose
constructor fails stops the run before any server starts.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.envs.errors import EnvLoadError, TaskError
from clawrl.envs.shipped import HARBOR_SETS, SHIPPED, Shipped
from clawrl.envs.tools import ToolSchemaError, find_tools

HARBOR = "harbor:"
HARBOR_SOLUTIONS = "harbor-solutions:"  # the reference solutions replayed through the gateway


@dataclass(frozen=True)
class EnvSpec:
    """A loaded environment: its name (for the store and the report), its class, its shipped
    defaults; a Harbor folder's task rows (`rows(split)`) and the time its verifier needs."""

    name: str
    factory: Callable[[], Any]
    shipped: Shipped | None = None
    rows: Callable[[str], list[dict[str, Any]]] | None = None
    min_tool_timeout_s: float = 0.0


def load_env(spec: str) -> EnvSpec:
    """The environment `spec` names (see the module docstring); EnvLoadError saying why not."""
    if spec.startswith(HARBOR):
        return _harbor(spec[len(HARBOR) :])
    if spec.startswith(HARBOR_SOLUTIONS):
        return _harbor(spec[len(HARBOR_SOLUTIONS) :], solutions=True)
    if spec in SHIPPED:
        shipped = SHIPPED[spec]
        return EnvSpec(spec, _class(load_object(shipped.env, "environment"), spec), shipped)
    return EnvSpec(_short_name(spec), _class(load_object(spec, "environment"), spec))


def harbor_path(where: str) -> Path:
    """The folder `harbor:WHERE` names: a path, or the name of a set in HARBOR_SETS."""
    path = Path(where).expanduser()
    if not path.exists() and where and "/" not in where and (HARBOR_SETS / where).is_dir():
        return HARBOR_SETS / where
    return path


def _harbor(where: str, solutions: bool = False) -> EnvSpec:
    """`harbor:PATH` (a folder of Harbor task folders) or `harbor:NAME` (a set in HARBOR_SETS);
    `solutions`: `harbor-solutions:`, the reference solutions as forced tool calls."""
    from functools import partial

    from clawrl.config import Config
    from clawrl.envs.harbor.env import COMMAND_WALL_S, HarborEnv, HarborSolutions, reward_timeout_s, rows
    from clawrl.envs.harbor.sandbox import SandboxUnavailable, find_bwrap

    path = harbor_path(where)
    try:
        timeout = max(reward_timeout_s(path), COMMAND_WALL_S + 10)
    except TaskError as exc:
        raise EnvLoadError(str(exc)) from exc
    try:
        find_bwrap(Config().cache_dir())
    except SandboxUnavailable as exc:
        raise EnvLoadError(f"harbor: {exc}") from exc
    prefix, env = (HARBOR_SOLUTIONS, HarborSolutions) if solutions else (HARBOR, HarborEnv)
    return EnvSpec(f"{prefix}{path.name}", env, rows=partial(rows, path), min_tool_timeout_s=timeout)


def load_reward(spec: str) -> Callable[..., Any]:
    """The reward function `spec` (FILE.py:func or module:func) names."""
    func = load_object(spec, "reward function")
    if not callable(func):
        raise EnvLoadError(f"reward function {spec}: {type(func).__name__} is not callable")
    return func


def probe(env: EnvSpec, has_reward_function: bool) -> list[str]:
    """Build one instance as an episode would and check the contract; its tool names before reset.

    EnvLoadError when it cannot be built, has no callable `reset`, has a tool without a
    schema, or has no reward source (neither `get_reward` nor `--reward`)."""
    try:
        instance = env.factory()
    except Exception as exc:
        raise EnvLoadError(f"cannot construct environment {env.name}: {_error(exc)}") from exc
    if not callable(getattr(instance, "reset", None)):
        raise EnvLoadError(f"environment {env.name} has no reset method (TRL's contract needs one)")
    if not has_reward_function and not callable(getattr(instance, "get_reward", None)):
        raise EnvLoadError(
            f"environment {env.name} has no get_reward method: "
            "give a reward function with --reward FILE.py:func"
        )
    try:
        return find_tools(instance).names
    except ToolSchemaError as exc:
        raise EnvLoadError(f"environment {env.name}: {exc}") from exc


def load_object(spec: str, what: str) -> Any:
    """The object `spec` names: `FILE.py:Name` or `module:Name` (dots in Name walk attributes)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise EnvLoadError(f"{what} {spec!r}: expected FILE.py:Name or module:Name")
    module = _import_file(where, what) if where.endswith(".py") else _import_module(where, what)
    value: Any = module
    for part in name.split("."):
        if not hasattr(value, part):
            raise EnvLoadError(f"{what} {spec}: {where} has no {name!r}")
        value = getattr(value, part)
    return value


def _import_module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise EnvLoadError(f"{what}: no module named {name!r}") from exc
        raise EnvLoadError(f"{what}: importing {name} failed: {_error(exc)}") from exc
    except Exception as exc:
        raise EnvLoadError(f"{what}: importing {name} failed: {_error(exc)}") from exc


def _import_file(path_text: str, what: str) -> Any:
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise EnvLoadError(f"{what}: no file {path_text}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    module_name = f"clawrl_user_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EnvLoadError(f"{what}: cannot import {path_text}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its sibling modules import as they would from a script
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise EnvLoadError(f"{what}: importing {path_text} failed: {_error(exc)}") from exc
    return module


def _class(value: Any, spec: str) -> Callable[[], Any]:
    if not callable(value):
        raise EnvLoadError(f"environment {spec}: {type(value).__name__} is not a class")
    return value  # type: ignore[no-any-return]


def _short_name(spec: str) -> str:
    """`path/to/my_env.py:MyEnv` -> `my_env:MyEnv`; `pkg.mod:MyEnv` stays."""
    where, _, name = spec.rpartition(":")
    return f"{Path(where).stem}:{name}" if where.endswith(".py") else spec


def _error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def read_tasks(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL tasks file; TaskError naming the line that is not a task."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskError(f"cannot read the tasks file {path}: {exc.strerror or exc}") from exc
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TaskError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(row, dict) or "prompt" not in row:
            raise TaskError(
                f'{path}:{number}: a task is a JSON object with a "prompt" (messages or a string)'
            )
        rows.append(row)
    if not rows:
        raise TaskError(f"{path} holds no tasks")
    return rows


def shipped_tasks(env: EnvSpec, split: str, seed: int) -> list[dict[str, Any]]:
    """A shipped environment's own tasks for `split` (a Harbor folder's: its task folders)."""
    if env.rows is not None:
        return env.rows(split)
    if env.shipped is None:
        raise TaskError(
            f"environment {env.name} is not a shipped one: give its tasks with --tasks FILE.jsonl"
        )
    if split not in env.shipped.splits:
        raise TaskError(f"--split {split!r}: {env.name} has the splits {', '.join(env.shipped.splits)}")
    generate = load_object(env.shipped.tasks, "task generator")
    params = inspect.signature(generate).parameters
    rows = generate(split=split, seed=seed) if "seed" in params else generate(split=split)
    return list(rows)


def task_id(row: dict[str, Any], index: int) -> str:
    """A row's task id: its `id` (or `task_id`) column, else `row-<index>`."""
    for key in ("id", "task_id"):
        value = row.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return f"row-{index}"
