"""docs/design.md stays true: every top-level package of clawrl and every import-linter contract
in pyproject.toml is named there (as test_layers checks that the contracts hold)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def _section(title: str) -> str:
    start = DESIGN.index(f"## {title}\n")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start : end if end != -1 else None]


def top_level_packages() -> list[str]:
    """clawrl's packages (folders with __init__.py) and modules, as the layers name them."""
    names = []
    for path in sorted((ROOT / "clawrl").iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            names.append(path.name)
        elif path.suffix == ".py" and path.name != "__init__.py":
            names.append(path.stem)
    return names


def contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_every_top_level_package_is_in_the_layers_and_the_package_map():
    layers, packages = _section("Layers"), _section("Packages")
    assert len(top_level_packages()) > 10
    for name in top_level_packages():
        assert f"clawrl.{name}" in layers, f"clawrl.{name} is not in docs/design.md's Layers"
        shown = f"  {name}/" if (ROOT / "clawrl" / name).is_dir() else f"  {name}.py"
        assert shown in packages, f"{shown.strip()} is not in docs/design.md's Packages"


def test_every_layer_in_pyproject_is_drawn_and_every_contract_is_named():
    layers = _section("Layers")
    (layered,) = [c for c in contracts() if c["type"] == "layers"]
    drawn = [line.split("  ")[0].strip() for line in layers.splitlines() if line.startswith("clawrl.")]
    assert [
        " | ".join(f"clawrl.{m.strip()}" for m in layer.split("|")) for layer in layered["layers"]
    ] == drawn
    for contract in contracts():
        assert f'"{contract["name"]}"' in layers, f"contract {contract['name']!r} is not named in Layers"


def test_each_kind_of_addition_has_its_section():
    for title in ("Adding an engine", "Adding a method", "Adding an environment"):
        assert _section(title).count("\n") > 5, title
