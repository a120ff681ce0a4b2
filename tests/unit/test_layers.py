"""The layers hold (docs/design.md, "Layers"): import-linter's contracts in pyproject.toml,
run here so that a change importing up a layer, across independent siblings, from the tests,
or into an engine's own package fails CI. Plus the registries the config is checked against."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from clawrl.algo import METHODS
from clawrl.config import Config, EngineConfig
from clawrl.engine.registry import ENGINES, build_engine

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is a test dependency (pyproject.toml [test])"
    env = {**os.environ, "PYTHONPATH": str(root)}  # the packages under `root`, not the installed ones
    return subprocess.run([exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_every_import_linter_contract_is_kept():
    result = _lint_imports()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout and "Contracts: 5 kept, 0 broken." in result.stdout, result.stdout


def test_an_import_up_a_layer_is_caught(tmp_path):
    """The contracts can fail: in a copy of the tree, a store module importing the API breaks them."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("clawrl", "bench", "tests"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "clawrl" / "store" / "probe.py").write_text("import clawrl.api.app  # goes up four layers\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "clawrl.store is not allowed to import clawrl.api" in result.stdout, result.stdout
    assert "clawrl.store.probe -> clawrl.api.app" in result.stdout, result.stdout


def test_the_engine_kinds_the_config_accepts_are_the_registry():
    kinds = get_args(EngineConfig.model_fields["kind"].annotation)
    assert set(kinds) == {"auto", *ENGINES}  # "auto": one of them, decided at start (engine/choice.py)


def test_every_registered_builder_can_be_imported():
    import importlib

    for kind, target in ENGINES.items():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), kind


def test_an_unknown_method_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'ppo'; known methods: rl, opd, combine, grpo"):
        Config(method="ppo")
    assert Config(method="grpo").method == "grpo" and list(METHODS) == ["rl", "opd", "combine", "grpo"]


def test_an_unknown_engine_kind_is_refused_by_the_registry():
    config = Config()
    # Past the config's own check (its Literal): the registry refuses it too.
    object.__setattr__(config.engine, "kind", "sglang")
    with pytest.raises(ValueError, match="unknown engine.kind 'sglang'; known: local, vllm"):
        build_engine(config)
