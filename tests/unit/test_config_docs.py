"""The configuration docs stay true (issue 58): a test walks the config model.

- Every field of `Config` appears in configs/example.toml (set, or commented out as `# name = ...`
  under its section) or is named in docs/configuration.md as `section.field`.
- configs/example.toml says it holds "every field with its default": each value it sets is the
  model's default.
- docs/configuration.md states a default as "`section.field` (default `value`)"; each such
  statement is checked against the model.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from clawrl.config import Config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "example.toml"
DOC = ROOT / "docs" / "configuration.md"
DEFAULT_STATED = re.compile(r"`([a-z_]+(?:\.[a-z_]+)*)` \(default `([^`]*)`\)")


def _section(annotation: Any) -> type[BaseModel] | None:
    for a in typing.get_args(annotation) or (annotation,):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def config_fields(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every leaf field of the config tree, dotted (`engine.vllm.port`)."""
    names = []
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        names += config_fields(section, f"{prefix}{name}.") if section else [f"{prefix}{name}"]
    return names


def example_names(text: str) -> set[str]:
    """The dotted names configs/example.toml sets or shows commented out, by its section headers."""
    section, names = "", set()
    for line in text.splitlines():
        if header := re.match(r"\s*\[([a-z_.]+)\]", line):
            section = header.group(1) + "."
        elif assignment := re.match(r"(?:# ?)?([a-z_]+)\s*=", line):
            names.add(section + assignment.group(1))
    return names


def default_of(dotted: str) -> Any:
    value: Any = Config()
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _plain(value: Any) -> Any:
    """A default as TOML and the docs write it (a path as its text, a tuple as a list)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _flatten(table: dict[str, Any], fields: set[str], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict) and prefix + key not in fields:
            flat |= _flatten(value, fields, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def test_every_config_field_is_in_the_example_or_the_configuration_doc():
    shown, doc = example_names(EXAMPLE.read_text()), DOC.read_text()
    missing = [f for f in config_fields() if f not in shown and f"`{f}`" not in doc]
    assert not missing, (
        "config fields in neither configs/example.toml nor docs/configuration.md (add each, with "
        f"its default, to the example): {missing}"
    )


def test_the_example_sets_each_field_to_its_default():
    fields = set(config_fields())
    example = _flatten(tomllib.loads(EXAMPLE.read_text()), fields)
    unknown = sorted(set(example) - fields)
    assert not unknown, f"configs/example.toml sets fields the config does not have: {unknown}"
    wrong = {k: (v, _plain(default_of(k))) for k, v in example.items() if v != _plain(default_of(k))}
    assert not wrong, f"configs/example.toml (value, the model's default) where they differ: {wrong}"


def test_each_default_the_configuration_doc_states_is_the_models():
    stated = DEFAULT_STATED.findall(DOC.read_text())
    assert len(stated) >= 3, "docs/configuration.md states defaults as `section.field` (default `value`)"
    fields = set(config_fields())
    wrong = [
        f"`{name}` (default `{value}`): the model's is {_plain(default_of(name))!r}"
        if name in fields
        else f"`{name}` is not a config field"
        for name, value in stated
        if name not in fields or value != _as_doc(_plain(default_of(name)))
    ]
    assert not wrong, "docs/configuration.md states defaults the model does not have:\n" + "\n".join(wrong)


def _as_doc(value: Any) -> str:
    """A default as the doc writes it between backticks: None as `None`, booleans as TOML's."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def test_the_checks_catch_a_missing_field_and_a_wrong_default():
    assert "engine.vllm.port" in config_fields() and "train.lora.rank" in config_fields()
    assert example_names("[a]\nx = 1\n# y = 2\n[a.b]\nz = 3\n") == {"a.x", "a.y", "a.b.z"}
    line = "`server.port` (default `8001`) and `train.adapters` (default `auto`)"
    stated = dict(DEFAULT_STATED.findall(line))
    assert stated == {"server.port": "8001", "train.adapters": "auto"}
    assert _as_doc(default_of("server.port")) != stated["server.port"]
    assert _as_doc(default_of("train.adapters")) == stated["train.adapters"]
