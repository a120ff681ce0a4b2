"""One typed config tree for clawrl.

Sources, later ones winning: the defaults in the sections, a TOML file (`--config run.toml`),
environment variables (only the few named in `section.py`, read in this module alone), and
dotted command-line overrides (`--server.port 30000`, `--server.api-key KEY`;
dashes and underscores are the same). Unknown keys are errors, so a typo in a
config file fails loudly instead of being ignored.

The sections live by role: `serving.py` (server, model, engine, collect, judge, memory) and
`training.py` (train, its LoRA and distributed parts, guard, grpo); every name is importable
from `clawrl.config`. The resolved tree is written to `<run_dir>/config.json` by `clawrl serve`.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from clawrl.algo import METHODS
from clawrl.config.guard import GuardConfig
from clawrl.config.section import API_KEY_ENV, CACHE_ENV, JUDGE_KEY_ENV, VLLM_KEY_ENV, Section
from clawrl.config.serving import (
    CollectConfig,
    EngineConfig,
    JudgeConfig,
    MemoryConfig,
    ModelConfig,
    ServerConfig,
    VLLMConfig,
)
from clawrl.config.training import DistributedConfig, GrpoConfig, LoraConfig, TrainConfig

__all__ = [
    "API_KEY_ENV",
    "CACHE_ENV",
    "JUDGE_KEY_ENV",
    "CollectConfig",
    "Config",
    "ConfigError",
    "DistributedConfig",
    "EngineConfig",
    "GrpoConfig",
    "GuardConfig",
    "JudgeConfig",
    "LoraConfig",
    "MemoryConfig",
    "ModelConfig",
    "ServerConfig",
    "TrainConfig",
    "VLLMConfig",
    "launched_rank",
    "launched_world_size",
    "load_config",
    "parse_overrides",
]
MASK = "***"  # how config.json shows a key


class Config(Section):
    run_dir: Path = Field(Path("clawrl-run"), description="Folder for everything clawrl writes.")
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    collect: CollectConfig = Field(default_factory=CollectConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    method: str = Field(
        "combine",
        description="How judged turns become samples: binary RL (rl), on-policy distillation (opd), "
        "or both (combine); grpo for episodes in environments (Track 2, `clawrl envs`); any name in "
        "clawrl.algo.METHODS.",
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, name: str) -> str:
        if name not in METHODS:
            raise ValueError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}")
        return name

    @model_validator(mode="after")
    def _lora_fits_vllm(self) -> Config:
        rank, most = self.train.lora.rank, self.engine.vllm.max_lora_rank
        if self.engine.kind == "vllm" and self.train.weights == "lora" and rank > most:
            raise ValueError(
                f"train.lora.rank is {rank} but vLLM serves LoRA ranks up to engine.vllm.max_lora_rank "
                f"= {most}: every version would be refused. Raise --engine.vllm.max-lora-rank to {rank} "
                f"or lower --train.lora.rank to {most}"
            )
        return self

    @model_validator(mode="after")
    def _adapter_per_user_fits(self) -> Config:
        if self.train.adapters == "per_user" and self.train.weights == "full":
            raise ValueError(
                "train.adapters 'per_user' keeps a LoRA adapter per user, but train.weights is 'full': "
                "set --train.weights lora, or --train.adapters shared (one policy for every user)"
            )
        return self

    @property
    def per_user_adapters(self) -> bool:
        """Whether the trainer keeps an adapter per user and the engine serves each user theirs
        (`train.adapters`; 'auto': with `server.users` and LoRA)."""
        a = self.train.adapters
        return a == "per_user" or (
            a == "auto" and self.server.users is not None and self.train.weights == "lora"
        )

    @property
    def memory_distills(self) -> bool:
        """Whether a turn served with memory gives a distillation sample: `memory.distill`, and never
        into a policy other users are served (with `server.users`, per-user adapters only)."""
        return self.memory.distill and (self.server.users is None or self.per_user_adapters)

    def cache_dir(self) -> Path:
        """The folder holding converted models, resolved from config and environment."""
        if self.model.cache_dir:
            return Path(self.model.cache_dir).expanduser()
        if os.environ.get(CACHE_ENV):
            return Path(os.environ[CACHE_ENV]).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(xdg) / "clawrl"

    def dump(self) -> dict[str, Any]:
        """The resolved config as plain JSON data, the API key masked."""
        data = self.model_dump(mode="json")
        for section in (data["server"], data["judge"], data["engine"]["vllm"]):
            if section["api_key"] is not None:
                section["api_key"] = MASK
        return data

    def write(self) -> Path:
        """Write the resolved config to `<run_dir>/config.json` and return its path."""
        path = self.run_dir / "config.json"
        path.write_text(json.dumps(self.dump(), indent=2) + "\n")
        return path


def launched_world_size() -> int:
    """How many ranks the launcher that started this process runs (`WORLD_SIZE`, set by torch's elastic
    launcher under `accelerate launch` or torchrun); 1 when this process was not started as a rank."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's rank in the group its launcher runs (`RANK`); 0 when not started as a rank."""
    return int(os.environ.get("RANK", "0"))


class ConfigError(ValueError):
    """A config file or override that cannot be applied."""


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn `['--server.port', '30000', '--a.b=c']` into a nested dict.

    Values stay strings (pydantic coerces them to the field's type) unless they
    look like JSON lists or objects. A flag with no value means `true`.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--") or len(flag) == 2:
            raise ConfigError(f"expected a --section.key option, got {flag!r}")
        key, eq, value = flag[2:].partition("=")
        if not eq:
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            value = args[i + 1] if has_value else "true"
            i += 1 if has_value else 0
        _set_dotted(out, key.replace("-", "_"), _coerce(value))
        i += 1
    return out


def _coerce(value: str) -> Any:
    if value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"--{key}: {part} is a value, not a section")
    tree[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Build the config from an optional file, the environment and overrides.

    The file is TOML, or the JSON a run folder's `config.json` holds (its
    masked API keys are dropped: the environment or an override gives them).
    """
    data: dict[str, Any] = {} if path is None else _read_file(Path(path))
    if os.environ.get(API_KEY_ENV):
        data = _merge(data, {"server": {"api_key": os.environ[API_KEY_ENV]}})
    if os.environ.get(JUDGE_KEY_ENV):
        data = _merge(data, {"judge": {"api_key": os.environ[JUDGE_KEY_ENV]}})
    if os.environ.get(VLLM_KEY_ENV):
        data = _merge(data, {"engine": {"vllm": {"api_key": os.environ[VLLM_KEY_ENV]}}})
    return Config.model_validate(_merge(data, overrides or {}))


def _read_file(path: Path) -> dict[str, Any]:
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            vllm = data.get("engine", {}).get("vllm", {})
            for section in (data.get("server", {}), data.get("judge", {}), vllm):
                if section.get("api_key") == MASK:
                    del section["api_key"]
            return data
        return tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
